"""Suite-wide settings: a persistent XLA compilation cache shared by the tests and their subprocesses.

Many tests build the same tiny models and compile the same programs (several trainers in the resume
test, subprocess runs); the cache turns their repeated compilations into loads.
"""

import os
import tempfile

os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(tempfile.gettempdir(), "glmrl_test_xla_cache"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
