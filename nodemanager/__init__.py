"""NodeManager: registration, heartbeats, container launch, cgroups, RSS monitor, logs, recovery."""
