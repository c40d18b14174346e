"""The daemon's front: the client-facing control plane (``docs/internals/daemon.md``).

- :mod:`~llamad.front.front_proc`: the process (actor ``llamad.front`` on the daemon's
  endpoint, its loop, the ops of :mod:`llamad.front.wire`);
- :mod:`~llamad.front.models`: loads, unloads, routes waiting on them, load
  progress, keep_alive;
- :mod:`~llamad.front.table`: the table of models and its rules (a plain object);
- :mod:`~llamad.front.load_request`: ``load_model``'s options by the config's rules;
- :mod:`~llamad.front.lanes`, :mod:`~llamad.front.watch`: blocking calls and
  ``model_sup``'s events off the loop;
- :mod:`~llamad.front.persist`: the table for a restarted front;
- :mod:`~llamad.front.status`: the daemon's ``status``;
- :mod:`~llamad.front.metrics`: the daemon's ``metrics`` (every worker's
  board, the cache's counters; rendered by :mod:`llamad.client.prometheus`).
"""
