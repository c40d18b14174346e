"""The ``llamad`` command (SPEC D4): one module per command group.

- :mod:`~llamad.cli.main`: the parser and ``main`` (the console script);
- :mod:`~llamad.cli.generate`: complete, chat, embed, tokenize (a model's worker);
- :mod:`~llamad.cli.control`: status, models, load, unload, cache (the front);
- :mod:`~llamad.cli.config`: ``config check`` and ``config example``;
- :mod:`~llamad.cli.install`: ``install-unit``; :mod:`~llamad.cli.keys`: ``keys generate``;
- :mod:`~llamad.cli.connect`, :mod:`~llamad.cli.render`, :mod:`~llamad.cli.errors`:
  the connection, what is printed, and the exit status of each error family;
- :mod:`~llamad.cli.demo`: ``make run``.

``python -m llamad.cli`` runs the command.
"""
