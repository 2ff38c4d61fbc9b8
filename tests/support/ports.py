"""Free loopback ports for the clusters tests start."""

import socket


def free_ports(count: int) -> list[int]:
  """``count`` ports of 127.0.0.1 that were free a moment ago."""
  sockets = [socket.socket() for _ in range(count)]
  for s in sockets:
    s.bind(("127.0.0.1", 0))
  ports = [s.getsockname()[1] for s in sockets]
  for s in sockets:
    s.close()
  return ports
