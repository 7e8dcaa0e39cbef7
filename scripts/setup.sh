#!/usr/bin/env bash
# Creates .venv with rocketraft and its test dependencies, and the system tools the tests use (nftables for
# partitions, Java for Spark; with --tests also chromium and its driver for the dashboard's browser tests, and a
# Docker engine with Compose for the compose cluster test, and the drivers of the official Java and Go SDKs built with
# Maven and Go: tests/sdk_java, tests/sdk_go).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v nft >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing nftables (network-partition tests) ..."
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nftables >/dev/null) \
    || echo "warning: could not install nftables; partition tests will be skipped (failed under CI)"
fi
if ! command -v java >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing a Java runtime (the Spark audit, audit/) ..."
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jre-headless >/dev/null) \
    || echo "warning: could not install Java 17; the audit tests will fail"
fi
if [ "${1:-}" = "--tests" ] && ! { command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; } \
    && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing chromium and chromium-driver (the dashboard's browser tests, tests/dashboard) ..."
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null) \
    || echo "warning: could not install chromium; the dashboard tests will fail"
fi
# The compose cluster test (tests/test_docker_compose.py) runs on a real Docker engine: Debian's docker.io and Compose
# v1 (docker-compose), and dockerd started here when none answers (there is no systemd on the CI machines).
if [ "${1:-}" = "--tests" ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 \
    && ! { command -v dockerd >/dev/null 2>&1 && command -v docker-compose >/dev/null 2>&1; }; then
  echo "installing docker.io and docker-compose (the compose cluster test, tests/test_docker_compose.py) ..."
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io docker-compose >/dev/null) \
    || echo "warning: could not install docker.io and docker-compose; the compose cluster test will be skipped"
fi
if [ "${1:-}" = "--tests" ] && [ "$(id -u)" = 0 ] && command -v dockerd >/dev/null 2>&1 \
    && ! docker info >/dev/null 2>&1; then
  echo "starting dockerd (log: /var/log/rocketraft-dockerd.log) ..."
  setsid nohup dockerd >/var/log/rocketraft-dockerd.log 2>&1 </dev/null &
  for _ in $(seq 1 30); do docker info >/dev/null 2>&1 && break; sleep 1; done
  docker info >/dev/null 2>&1 \
    || echo "warning: dockerd did not start (/var/log/rocketraft-dockerd.log); the compose cluster test will be skipped"
fi
if [ ! -x .venv/bin/python ]; then
  python3.11 -m venv .venv 2>/dev/null || python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[test]"
if [ "${1:-}" = "--tests" ]; then
  if command -v npm >/dev/null 2>&1; then
    echo "installing the official Node.js SDK (tests/sdk_node) ..."
    (cd tests/sdk_node && npm ci --no-audit --no-fund --silent) \
      || echo "warning: npm ci failed in tests/sdk_node; the Node.js SDK tests will be skipped"
  else
    echo "warning: npm not found (Node.js 18+); the Node.js SDK tests (tests/sdk_node) will be skipped"
  fi
  # The official Java and Go SDKs, each with our driver built once here (devkit/sdkdrivers.py runs them).
  if command -v mvn >/dev/null 2>&1 && command -v javac >/dev/null 2>&1; then
    echo "building the official Java SDK's driver (tests/sdk_java, rocketmq-client-java) ..."
    (cd tests/sdk_java && mvn -q -B package -DskipTests) \
      || echo "warning: mvn package failed in tests/sdk_java; the Java SDK tests will be skipped"
  else
    echo "warning: Maven or a JDK not found; the Java SDK tests (tests/sdk_java) will be skipped"
  fi
  # Apache RocketMQ itself (NameServer, DLedger broker, proxy, mqadmin): the reference cluster devkit/reference.py runs.
  if command -v mvn >/dev/null 2>&1 && command -v javac >/dev/null 2>&1; then
    echo "installing Apache RocketMQ's jars for the reference cluster (tests/reference, into target/lib) ..."
    (cd tests/reference && mvn -q -B package -DskipTests) \
      || echo "warning: mvn package failed in tests/reference; the reference tests will be skipped"
  else
    echo "warning: Maven or a JDK not found; the reference tests (tests/reference) will be skipped"
  fi
  if command -v go >/dev/null 2>&1; then
    echo "building the official Go SDK's driver (tests/sdk_go, rocketmq-clients/golang/v5) ..."
    (cd tests/sdk_go && go build -o sdk-go-driver .) \
      || echo "warning: go build failed in tests/sdk_go; the Go SDK tests will be skipped"
  else
    echo "warning: go not found; the Go SDK tests (tests/sdk_go) will be skipped"
  fi
  # The RocketMQ 4.x clients (Remoting protocol), each with our driver built once here (devkit/remotingdrivers.py).
  if command -v mvn >/dev/null 2>&1 && command -v javac >/dev/null 2>&1; then
    echo "building the RocketMQ 4.x Java client's driver (tests/remoting_java, rocketmq-client 4.9.8) ..."
    (cd tests/remoting_java && mvn -q -B package -DskipTests) \
      || echo "warning: mvn package failed in tests/remoting_java; the 4.x Java client tests will be skipped"
  else
    echo "warning: Maven or a JDK not found; the 4.x Java client tests (tests/remoting_java) will be skipped"
  fi
  if command -v go >/dev/null 2>&1; then
    echo "building the RocketMQ 4.x Go client's driver (tests/remoting_go, rocketmq-client-go/v2) ..."
    (cd tests/remoting_go && go build -o remoting-go-driver .) \
      || echo "warning: go build failed in tests/remoting_go; the 4.x Go client tests will be skipped"
  else
    echo "warning: go not found; the 4.x Go client tests (tests/remoting_go) will be skipped"
  fi
  # The RocketMQ C++ client as the Node addon rocketmq-nodejs: prebuilt inside the npm package, nothing compiled.
  if command -v npm >/dev/null 2>&1; then
    echo "installing the RocketMQ C++ client (tests/remoting_node, rocketmq-nodejs 1.1.2) ..."
    (cd tests/remoting_node && npm ci --no-audit --no-fund --silent) \
      || echo "warning: npm ci failed in tests/remoting_node; the 4.x C++ client tests will be skipped"
  else
    echo "warning: npm not found (Node.js 18+); the 4.x C++ client tests (tests/remoting_node) will be skipped"
  fi
fi
