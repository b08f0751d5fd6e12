"""environments package."""
