"""Domain models shared by the RM, the AMs and the CLI."""
