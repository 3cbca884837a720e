"""``ppas experiment``: live comparisons on a real engine.

``spec`` (the file), ``plan`` (runs and time estimate), ``runner`` (orchestrates ``folder``,
``runfile``, ``servers``, ``measure``, ``stopping``, ``devices``, ``progress``), ``report``
(``tables``, ``prediction``, ``figure``)."""
