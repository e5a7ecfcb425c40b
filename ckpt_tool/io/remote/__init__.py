"""URLs read by byte ranges: the session, the file, one fetcher per protocol, and what reading cost."""
