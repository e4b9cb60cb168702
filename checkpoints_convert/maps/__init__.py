"""Key maps (HF <-> Flax rule tables), one module per checkpoint component."""
