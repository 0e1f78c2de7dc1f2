"""Test tool: put this folder on PYTHONPATH (with $FA4TRACE_NET_LOG set) and every connection,
datagram or name lookup of that Python process that would leave this machine is written to
$FA4TRACE_NET_LOG (one line each) and refused. Loopback and Unix sockets pass.

tests/test_viewer_server.py runs `fa4trace view` under it to show the viewer makes no network
request; processes started by that one (PYTHONPATH is inherited) are guarded too.
"""

import ipaddress
import os
import socket

_LOG = os.environ.get("FA4TRACE_NET_LOG")
_LOCAL_NAMES = {"", "localhost", "localhost.localdomain", "ip6-localhost"}


def _local_host(host) -> bool:
    if host is None:
        return True
    if isinstance(host, bytes):
        host = host.decode(errors="replace")
    host = str(host).strip("[]").split("%")[0].lower()
    if host in _LOCAL_NAMES:
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False  # a name: resolving it may ask a DNS server
    if getattr(ip, "ipv4_mapped", None):
        ip = ip.ipv4_mapped
    return ip.is_loopback or ip.is_unspecified


def _local_addr(addr) -> bool:
    if isinstance(addr, (str, bytes)):  # AF_UNIX
        return True
    return _local_host(addr[0])


def _refuse(what, target):
    with open(_LOG, "a") as f:
        f.write(f"pid {os.getpid()} {what} {target!r}\n")
    raise ConnectionRefusedError(f"network access refused by the test guard: {what} {target!r}")


if _LOG:
    _connect = socket.socket.connect
    _connect_ex = socket.socket.connect_ex
    _sendto = socket.socket.sendto
    _getaddrinfo = socket.getaddrinfo

    def connect(self, addr):
        if self.family != getattr(socket, "AF_UNIX", None) and not _local_addr(addr):
            _refuse("connect", addr)
        return _connect(self, addr)

    def connect_ex(self, addr):
        if self.family != getattr(socket, "AF_UNIX", None) and not _local_addr(addr):
            _refuse("connect_ex", addr)
        return _connect_ex(self, addr)

    def sendto(self, data, *args):
        addr = args[-1]
        if self.family != getattr(socket, "AF_UNIX", None) and not _local_addr(addr):
            _refuse("sendto", addr)
        return _sendto(self, data, *args)

    def getaddrinfo(host, *args, **kwargs):
        if not _local_host(host):
            _refuse("getaddrinfo", host)
        return _getaddrinfo(host, *args, **kwargs)

    socket.socket.connect = connect
    socket.socket.connect_ex = connect_ex
    socket.socket.sendto = sendto
    socket.getaddrinfo = getaddrinfo
