"""The msgpack wire format: versioned frames, schema-checked on decode, MACed, sealed or
signed.

Frame: msgpack array `[VERSION, type, body, mac]` (`frames`). Peer frames are sealed
(`sealed`: ChaCha20-Poly1305 per link) or, with `--seal-links off`, MACed (`peer`); control
frames are signed, and what determines a model travels sealed inside them (`signed`). Each
message is declared once, as its dataclass (`privnet.agent.messages`, `privnet.agent.control`):
`catalog` names the messages, `schema` derives each field's form and checks from its type. Vectors
are `{"dtype": "<f8", "shape": [M], "data": <raw little-endian float64>}`; model frames, nearly
all of the traffic, have a fast path (`model`, `sealed`) with the generic path's bytes.

Every decode either returns a message or raises `Rejected(reason, detail)`.
"""

from privnet.agent.spec import COUNT_LIMIT, ID_LIMIT, PARAM_DEPTH
from privnet.agent.wire.catalog import VERSION, Peer, category
from privnet.agent.wire.chunks import (
    CHUNK_BYTES,
    MAX_CHUNKS,
    chunk_count,
    max_chunked_dim,
    needs_chunks,
)
from privnet.agent.wire.frames import MAX_CONTROL_BYTES, MAX_PEER_BYTES, SETUP_FLOATS, check_route
from privnet.agent.wire.mac import MAC_BYTES
from privnet.agent.wire.peer import (
    decode_peer,
    encode_peer,
    max_model_dim,
    model_frame_bytes,
    peek_peer,
)
from privnet.agent.wire.schema import DTYPE, F4, U4
from privnet.agent.wire.sealed import (
    KEY_KIND,
    MODEL_KIND,
    SEAL_AD_TAG,
    Head,
    open_head,
    open_model,
    read_head,
    seal_peer,
)
from privnet.agent.wire.signed import (
    SIGN_TAG,
    SIGNATURE_BYTES,
    SignedFrame,
    decode_checkpoint,
    decode_config,
    decode_link_keys,
    decode_report,
    decode_reports,
    decode_signed,
    encode_checkpoint,
    encode_config,
    encode_link_keys,
    encode_report,
    encode_reports,
    encode_signed,
    max_report_dim,
    reports_per_message,
)
from privnet.agent.wire.telemetry import (
    as_telemetered,
    decode_telemetry,
    default_models_every,
    encode_telemetry,
    metric_values,
    metrics,
    pack_items,
    part_count,
    part_dim,
    split,
    telemetry_dtype,
)

__all__ = [
    "CHUNK_BYTES",
    "COUNT_LIMIT",
    "DTYPE",
    "F4",
    "ID_LIMIT",
    "KEY_KIND",
    "MAC_BYTES",
    "MAX_CHUNKS",
    "MAX_CONTROL_BYTES",
    "MAX_PEER_BYTES",
    "MODEL_KIND",
    "PARAM_DEPTH",
    "SEAL_AD_TAG",
    "SETUP_FLOATS",
    "SIGNATURE_BYTES",
    "SIGN_TAG",
    "U4",
    "VERSION",
    "Head",
    "Peer",
    "SignedFrame",
    "as_telemetered",
    "category",
    "check_route",
    "chunk_count",
    "decode_checkpoint",
    "decode_config",
    "decode_link_keys",
    "decode_peer",
    "decode_report",
    "decode_reports",
    "decode_signed",
    "decode_telemetry",
    "default_models_every",
    "encode_checkpoint",
    "encode_config",
    "encode_link_keys",
    "encode_peer",
    "encode_report",
    "encode_reports",
    "encode_signed",
    "encode_telemetry",
    "max_chunked_dim",
    "max_model_dim",
    "max_report_dim",
    "metric_values",
    "metrics",
    "model_frame_bytes",
    "needs_chunks",
    "open_head",
    "open_model",
    "pack_items",
    "part_count",
    "part_dim",
    "peek_peer",
    "read_head",
    "reports_per_message",
    "seal_peer",
    "split",
    "telemetry_dtype",
]
