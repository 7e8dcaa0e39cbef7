"""What the servers (broker/, namesrv/, dashboard/) share and clients never need: the gRPC server they are built
with (serving), the checks at their doors (auth_guard, auth_verify, auth_audience, namespaced, refusals), the
metrics endpoint (metrics), the permissive TLS port (tls_permissive and its child process, splicer_child), the
Remoting port (remoting_server, remoting_acl), topic and group configs (configs), and stopping with the process that
started them (parentwatch).
"""
