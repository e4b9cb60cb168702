"""Scorers served by `python -m glmrl.rewards.server --scorer=glmrl.rewards.scorers.<module>:<function>`: the
engines behind the server-backed rewards, in the server's process (their dependencies stay out of training's)."""
