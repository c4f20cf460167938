"""What the tests share: envs (``support.envs``, ``support.coroutine_envs``), the batch
invariants (``support.checks``) and process and leak probes (``support.procs``)."""
