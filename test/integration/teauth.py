"""The transfer engine's authentication from the outside, for the tests:
the connection handshake of src/transfer/wire.h (tcp data port and shm
socket) and the Challenge / GetDescriptor calls of proto/transfer.proto,
written here from their specifications. Needs build/py on sys.path
(mctest puts it there). test_security.py uses it, as the test and as the
script it runs as a second user.
"""
import hashlib
import hmac
import os
import socket
import struct

import grpc
import transfer_pb2

EACCES = -13

HS_MAGIC, HS_BYTES = 0x4854434D, 608
HELLO, CHALLENGE, AUTH, RESULT = 1, 2, 3, 4
WIRE_MAGIC, WIRE_READ, WIRE_RESP = 0x4454434D, 1, 3


def hs(kind, flags=0, nonce=bytes(32), mac=bytes(32), name=b"", target=b""):
    b = struct.pack("<IHBBiI", HS_MAGIC, 1, kind, flags, 0, 0) + nonce + mac
    b += name.ljust(256, b"\0") + target.ljust(256, b"\0") + bytes(16)
    assert len(b) == HS_BYTES
    return b


def hs_parse(b):
    assert len(b) == HS_BYTES, len(b)
    magic, _, kind, _, status, _ = struct.unpack_from("<IHBBiI", b)
    assert magic == HS_MAGIC
    return kind, status, b[16:48], b[48:80]


def hs_mac(secret, server, a, b, name):
    label = b"mooncake-te-server\0" if server else b"mooncake-te-client\0"
    return hmac.new(secret, label + a + b + name, hashlib.sha256).digest()


class Peer:
    """The client side of the handshake over a stream (tcp) or seqpacket
    (shm) socket; sent and received messages are kept for replays."""

    def __init__(self, sock):
        self.s = sock
        self.s.settimeout(10)
        self.sent = []

    def send(self, b):
        self.sent.append(b)
        self.s.sendall(b)

    def recv(self):
        if self.s.type == socket.SOCK_SEQPACKET:
            data, anc, _, _ = self.s.recvmsg(HS_BYTES, socket.CMSG_SPACE(4 * 4))
            for level, typ, fds in anc:
                if level == socket.SOL_SOCKET and typ == socket.SCM_RIGHTS:
                    for i in range(0, len(fds) - len(fds) % 4, 4):
                        os.close(struct.unpack_from("i", fds, i)[0])
            return data
        buf = b""
        while len(buf) < HS_BYTES:
            got = self.s.recv(HS_BYTES - len(buf))
            if not got:
                return buf
            buf += got
        return buf

    def handshake(self, target, secret=None, claim=None, name=b"intruder"):
        """Run it with secret (None: say we have none; claim: the flag we
        send regardless). Returns the final status."""
        nonce_c = os.urandom(32)
        has = secret is not None if claim is None else claim
        self.send(hs(HELLO, 1 if has else 0, nonce_c, name=name, target=target))
        kind, status, nonce_s, mac = hs_parse(self.recv())
        if kind == RESULT:
            return status
        assert kind == CHALLENGE, kind
        if secret is not None and mac == hs_mac(secret, True, nonce_c, nonce_s, target):
            mine = hs_mac(secret, False, nonce_s, nonce_c, name)
        else:
            mine = hs_mac(secret or b"guess", False, nonce_s, nonce_c, name)
        self.send(hs(AUTH, mac=mine))
        kind, status, _, _ = hs_parse(self.recv())
        assert kind == RESULT, kind
        return status

    def drain(self):
        """Every byte the server sends until it closes (or goes quiet
        for 10 s)."""
        data = b""
        try:
            while True:
                got = self.s.recv(65536)
                if not got:
                    return data
                data += got
        except (ConnectionResetError, socket.timeout):
            return data

    def closed(self):
        """True once the server closed the connection (EOF or reset)."""
        try:
            self.s.settimeout(10)
            return self.s.recv(4096) == b""
        except (ConnectionResetError, BrokenPipeError):
            return True

    def close(self):
        self.s.close()


def tcp_peer(port):
    return Peer(socket.create_connection(("127.0.0.1", port), timeout=10))


def shm_peer(name):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.connect("\0" + name)
    return Peer(s)


def read_header(addr, length, rid=1):
    return struct.pack("<IBBHiIQQ", WIRE_MAGIC, WIRE_READ, 0, 0, 0, length, rid, addr)


# ------------------------------------------------------------ gRPC


def rpc(addr, method, req, resp_type):
    with grpc.insecure_channel(addr) as ch:
        call = ch.unary_unary("/mooncake.transfer.Transfer/" + method,
                              request_serializer=lambda m: m.SerializeToString(),
                              response_deserializer=resp_type.FromString)
        return call(req, timeout=10)


def challenge(addr):
    return rpc(addr, "Challenge", transfer_pb2.ChallengeRequest(),
               transfer_pb2.ChallengeReply).nonce


def desc_mac(secret, nonce, name):
    return hmac.new(secret, b"mooncake-te-descriptor\0" + nonce + name.encode(),
                    hashlib.sha256).digest()


def get_descriptor(addr, name="", nonce=b"", mac=b""):
    return rpc(addr, "GetDescriptor",
               transfer_pb2.GetDescriptorRequest(name=name, challenge=nonce, mac=mac),
               transfer_pb2.SegmentDesc)


def refused(fn):
    """The gRPC status code fn's call ended with (None: it succeeded)."""
    try:
        fn()
    except grpc.RpcError as e:
        return e.code(), e.details()
    return None
