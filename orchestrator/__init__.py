"""orch: deploy, watch and compare training runs on Proxmox LXC containers."""

__version__ = "0.1.0"
