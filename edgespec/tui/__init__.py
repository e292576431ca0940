"""``edgespec chat``: a terminal chat that shows speculation at work.

- ``session.py``  the conversation over one Engine (no UI): method / temperature switches, KV reuse
  across turns, answer updates carrying the engine's drafted / target-produced text segments
- ``render.py``   the two token styles, safe display text, ANSI for line mode
- ``app.py``      the Textual app (``widgets.py``, ``screens.py``); ``jobs.py``: what runs on the
  engine thread (load, generate, measure) and the messages it sends back to the UI thread
- ``plain.py``    the line-based fallback for pipes and minimal terminals
- ``cli.py``      the click command ``chat``
"""
