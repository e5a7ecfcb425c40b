"""The reviewed catalog of globals a pickle may construct or call without side effects."""
