"""audit: Spark checks of replica stores (Raft log and broker tables); see audit/README.md."""
