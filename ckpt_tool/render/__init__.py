"""Renderers: text for people (tabulate), JSON for machines. No logic lives here."""
