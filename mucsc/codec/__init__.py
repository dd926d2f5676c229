"""The codec: the wire format, the codecs registered for it, and the public encode/decode API."""
