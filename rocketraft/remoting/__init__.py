"""RocketMQ's Remoting protocol, spoken by 4.x clients: its frames (frame.py), codes (codes.py) and message records
(records.py). The port that serves it is serverkit/remoting_server.py; the NameServer's and the broker's doors
(namesrv/remoting.py, broker/remoting.py) turn its requests into the same jobs the gRPC doors call."""
