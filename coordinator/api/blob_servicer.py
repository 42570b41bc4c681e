"""FarmBlobsServicer: content-addressed blob upload and download over protos.blobwire.

Split from server.py (the size rule); it maps BlobStore's errors to gRPC status codes.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import grpc

from coordinator.state.blobs import BlobError, BlobMismatch, BlobNotFound, BlobStore, BlobTooLarge
from protos.blobwire import Chunk, WireError

log = logging.getLogger(__name__)


class FarmBlobsServicer:
    """Content-addressed blob upload/download, verified on arrival; served with protos.blobwire's codec
    (chunks as views, hashed while they stream)."""

    def __init__(self, blobs: BlobStore) -> None:
        self.blobs = blobs

    def PutBlob(self, chunks: Iterator[Chunk], context) -> tuple[str, int]:
        try:
            return self.blobs.put_chunks(chunks)
        except BlobMismatch as exc:
            context.abort(grpc.StatusCode.DATA_LOSS, str(exc))
        except BlobTooLarge as exc:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        except (BlobError, WireError) as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except grpc.RpcError:  # the sender went away mid-stream (cancelled, killed, its connection cut)
            log.info("blob upload from %s cut off mid-stream; nothing kept", context.peer())
            context.abort(grpc.StatusCode.CANCELLED, "upload cut off")

    def GetBlob(self, sha: str, context) -> Iterator[Chunk]:
        try:
            chunks = self.blobs.wire_chunks(sha)
        except BlobNotFound:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no blob {sha}")
        except BlobError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        yield from chunks
