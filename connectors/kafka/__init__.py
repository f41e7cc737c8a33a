"""kafka connector."""
