"""Evaluation users trust: statistics with confidence intervals (`stats.py`) and the checkpoint comparison's
reports (`report.py`)."""
