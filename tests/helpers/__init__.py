"""What several test modules share and no test module is: checks, corpora, servers, writers and drivers.

Imported as ``tests.helpers.NAME``. Some modules here are also run as scripts
in a subprocess (hf_writers.py, third_party_writers.py, hf_loaders.py,
reference_loaders.py, crash_driver.py, malicious.py): those import their
siblings by plain name, with this folder first on ``sys.path``.
"""
