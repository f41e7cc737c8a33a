"""jdbc connector."""
