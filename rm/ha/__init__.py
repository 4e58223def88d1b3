"""ResourceManager high availability on etcd (docs/operating.md, "ResourceManager high availability").

`role.py` is the pure HA role machine (time as an argument); `etcd_kv.py` the etcd access both the
elector and the store share; `elector.py` the asyncio driver (campaign, lease renewal, fencing
checks); `etcd_store.py` the fenced state store; `ha_server.py` runs one RM process as standby or
active; `standby_app.py` what a standby serves.
"""
