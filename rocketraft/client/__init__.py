"""rocketraft's client library internals (asyncio). Users import `rocketraft` (blocking API) or
`rocketraft.aio` (asyncio API); both expose the same class and method names."""
