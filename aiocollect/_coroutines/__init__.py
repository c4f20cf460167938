"""Coroutine envs, in one place: envs whose ``reset`` and ``step`` are coroutines (a game
server over a socket, a simulator behind an RPC, a robot), stepped on the collector's event
loop, hundreds at once, each as soon as its action is ready.

* ``env``: [`AsyncEnv`][aiocollect.AsyncEnv], the base class (gymnasium's ``Env`` with
  ``async def reset`` and ``step``), and how one is recognised;
* ``group``: ``CoroutineGroup``, the group (``_envs.group``'s result arrays, one row per env)
  whose envs step one at a time; ordinary gymnasium envs may sit in it, stepped inline
  (``SyncEnvAdapter``) or in a worker thread ([`ThreadEnv`][aiocollect.ThreadEnv]);
* ``lanes``: a ``Collector``'s coroutine envs as lanes of the scheduler, one per env
  (``EnvLane``: the ``LaneWorker`` protocol of ``_workers.lane``), batched into policy calls
  by ``EnvQueueRounds`` (``_engine.rounds``) as EnvPool's knobs say;
* ``worker``: an entry of coroutine envs in a worker collector's ``create_env_fn``, stepped
  as a whole on the collector's loop (``CoroutineWorker``), beside the worker processes.
"""
