"""RocketMQ's Remoting protocol, spoken by 4.x clients: its frames (frame.py), codes (codes.py), message records
(records.py) and a server for its ports (server.py). The NameServer's and the broker's doors (namesrv/remoting.py,
broker/remoting.py) turn its requests into the same jobs the gRPC doors call."""
