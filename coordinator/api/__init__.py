"""The coordinator's endpoints: the gRPC servicers, the bulk data channel, the request guard, the join token and TLS, the watch fan-out, presence and the pack shelf."""
