"""A run's configuration: what a config may hold and how it is read and checked before any model is built.

- `choices`: the choices main.py's flags offer and the config's lists named once (light: no model code).
- `rules`: the rule types (`Rule`, `choice`, `integer`, ...) and `ConfigError`.
- `keys`: one rule per key of configs/common.py (`RULES`) and a config's keys and values (`leaves`).
- `cross_checks`: the rules that span several keys (the decoder's window within its steps, its draw of steps).
- `inert`: settings read only under a condition, refused where nothing reads them (`READ_WHEN`).
- `validation`: `validate(config, mode)`, the order of every check, and the files and folders a config names.
- `files`: YAML and JSON config files, read once and faithfully, layered on their base recipe.
- `command_line`: the command line's config errors (a flag, a config file's own error) in one line.
"""
