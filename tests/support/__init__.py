"""Helpers shared by the tests: tiny models, data, stack markers and subprocess scripts.

``FOLDER`` is this folder, where the scripts that tests run in a subprocess
(``mirrored_steps.py``, ``ps_steps.py``, ...) live; they import their siblings
by plain name, as a script does.
"""

import pathlib

FOLDER = pathlib.Path(__file__).parent
