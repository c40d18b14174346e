"""The daemon's root process and what it tells the operating system.

- :mod:`~llamad.daemon.main`: ``llamad daemon`` / ``python -m llamad.daemon``:
  load the config, claim the directories, run the tree, exit with a status
  systemd understands;
- :mod:`~llamad.daemon.tree`: the supervision tree built from a loaded config;
- :mod:`~llamad.daemon.readiness`: what the root tells systemd, and when;
- :mod:`~llamad.daemon.notify`: the ``sd_notify(3)`` protocol over a socket;
- :mod:`~llamad.daemon.unit`: the systemd unit that runs an installation.
"""
