"""The PS ApplicationMaster: runs one parameter-server training job (`python -m appmaster.ps`)."""
