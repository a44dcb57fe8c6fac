"""The `silod` command line."""
