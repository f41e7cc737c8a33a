"""s3 connector."""
