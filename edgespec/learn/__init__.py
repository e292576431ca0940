"""Learning from the user: the drafter fits what this user asks, on this machine only.

- ``store.py``: the bounded, crash-safe record store; ``recorder.py``: the engine's tap that
  fills it while decoding;
- ``dataset.py``, ``replay.py``, ``run.py``: a fine-tune of the EAGLE-3 head in use on the
  records mixed with general data; ``guard.py``: the new head is used only if it accepts more on
  the user's held-out recent history; ``versions.py``: heads kept by version, rollback;
- ``session.py``, ``flags.py``: on/off per surface, recording in a worker, learning while idle;
  ``status.py``: what ``edgespec learn status`` shows.
"""
