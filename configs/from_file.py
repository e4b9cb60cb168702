"""A config file of data (`--config=run.yaml` or `.json`; glmrl/config/files.py): main.py passes the file here.

`python main.py --config=run.yaml --workdir=W` (main.py turns it into `--config=configs/from_file.py:run.yaml`).
"""

from glmrl.config import files as config_files


def get_config(arg=None):
  if not arg:
    raise ValueError("this config takes the data file as its argument: configs/from_file.py:run.yaml")
  return config_files.layered(arg)
