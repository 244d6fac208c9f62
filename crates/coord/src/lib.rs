//! Control plane: the gRPC coordination service, its client, worker identity and config broadcast.
