"""Devices and processes: the mesh and where arrays live (sharding), several processes as one job
(distributed), what a device can do (accelerator), host malloc settings for the CPU backend
(host_memory), and what every entry point does first (start)."""
