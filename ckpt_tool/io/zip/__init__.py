"""The one zip reader and what is built on it: torch's (miniz's) reading of an archive, its storages,
the scanner's sweep.
"""
