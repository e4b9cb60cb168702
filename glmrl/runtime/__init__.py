"""The processes of a run: how JAX starts (`platform`), how several processes meet and end as one (`rendezvous`,
`distributed`, `agreement`, `peers`), and each process's own settings (`compilation_cache`, `device_memory`,
`gc_tuning`, `thread_errors`, `quiet_stderr`, `library_logs`). The package itself imports nothing: `glmrl`
imports `platform` and `library_logs` before JAX starts.
"""
