"""The web dashboard in a real headless chromium, against a real cluster (NameServer + 3 replicas) and the real
dashboard server processes: one read-only, one started with --allow-changes. One cluster and one browser for the
module; the master kill runs last."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request

import pytest
from dashkit import chrome, start_dashboard, traffic, wait_for
from selenium.webdriver.common.by import By

from devkit.devcluster import DevCluster

CONSUMED, PENDING = 10, 3


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with DevCluster(str(tmp_path_factory.mktemp("dashboard"))) as c:
        c.start()
        c.wait_master()
        traffic(c, CONSUMED, PENDING)
        yield c


@pytest.fixture(scope="module")
def read_write(cluster):
    proc, url = start_dashboard(cluster, allow_changes=True)
    yield url
    proc.stop()


@pytest.fixture(scope="module")
def read_only(cluster):
    proc, url = start_dashboard(cluster, allow_changes=False)
    yield url
    proc.stop()


@pytest.fixture(scope="module")
def browser():
    driver = chrome()
    yield driver
    driver.quit()


# Read in one script call: the page's live update may replace a section between two WebDriver calls.
def text_of(browser, element_id: str) -> str:
    return browser.execute_script("const e = document.getElementById(arguments[0]); return e ? e.innerText : ''",
                                  element_id)


def rows_of(browser, table_id: str) -> list[list[str]]:
    return browser.execute_script(
        "return Array.from(document.querySelectorAll('#' + arguments[0] + ' tbody tr'))"
        ".map(tr => Array.from(tr.querySelectorAll('td')).map(td => td.innerText.trim()))", table_id)


def admin_topic_list(cluster) -> list[str]:
    """What `rocketraft admin topicList` prints, word by word (the CLI run as a process)."""
    listed = subprocess.run([sys.executable, "-m", "cli", "admin", "topicList", "-n",
                             cluster.namesrv_address], capture_output=True, text=True, timeout=30)
    assert listed.returncode == 0, listed.stderr
    return listed.stdout.split()


def submit(browser, form_action: str, **fields: str) -> str:
    """Fill and submit the change form posting to form_action; the answer the page shows."""
    form = browser.find_element(By.CSS_SELECTOR, f'form[data-action="{form_action}"]')
    for name, value in fields.items():
        box = form.find_element(By.NAME, name)
        box.clear()
        box.send_keys(value)
    browser.execute_script("document.getElementById('flash').hidden = true")
    form.find_element(By.TAG_NAME, "button").click()
    return wait_for(lambda: browser.find_element(By.ID, "flash").is_displayed() and text_of(browser, "flash"),
                    f"an answer to {form_action}")


def test_every_page_shows_live_data_of_the_cluster(cluster, read_only, browser):
    master = cluster.master()
    browser.get(read_only + "/")
    replicas = wait_for(lambda: rows_of(browser, "replicas-broker-a"), "the replicas table")
    assert len(replicas) == 3
    assert {r[0] for r in replicas} == set(cluster.ids)
    assert [r[2] for r in replicas if r[0] == master] == ["LEADER"], replicas
    assert f"master {master}" in text_of(browser, "groups")

    browser.get(read_only + "/topics")
    orders = [r for r in rows_of(browser, "topic-table") if r[0] == "orders"]
    assert orders and orders[0][1:4] == ["", "normal", "broker-a: 4"], orders

    browser.get(read_only + "/groups?group=billing")
    progress = wait_for(lambda: rows_of(browser, "progress"), "billing's progress per queue")
    assert len(progress) == 4
    assert sum(int(r[4]) for r in progress) == CONSUMED        # consumer offsets
    assert sum(int(r[3]) for r in progress) == CONSUMED + PENDING  # broker offsets
    assert f"total lag {PENDING}" in text_of(browser, "progress")
    assert ["billing"] == [r[0] for r in rows_of(browser, "group-table") if r[7] == str(PENDING)]

    browser.get(read_only + "/messages?topic=orders&key=order-3")
    found = rows_of(browser, "messages")
    assert len(found) == 1 and found[0][5] == "created" and found[0][6] == "order-3", found
    browser.find_element(By.CSS_SELECTOR, "#messages a").click()
    assert wait_for(lambda: text_of(browser, "body"), "the message body") == '{"order": 3}'
    assert ["region", "eu-west"] in rows_of(browser, "properties")

    browser.get(read_only + "/dlq")
    assert "no dead letter" in text_of(browser, "dlq")


def test_the_users_page_flags_a_user_made_without_a_cluster_secret(cluster, read_only, browser):
    """Issue 30, item 5: a user made where nobody is authenticated (this cluster has no secret) is shown unconfirmed,
    with what to do."""
    made = subprocess.run([sys.executable, "-m", "cli", "admin", "createUser", "-u", "walk-in", "-p",
                           "walk-in-secret", "-n", cluster.namesrv_address], capture_output=True, text=True,
                          timeout=30)
    assert made.returncode == 0, made.stdout + made.stderr
    browser.get(read_only + "/users")
    rows = wait_for(lambda: rows_of(browser, "user-table"), "the users table")
    assert ["walk-in", "NORMAL", "ENABLE", "unconfirmed"] in rows, rows
    assert "confirmUser" in text_of(browser, "users")
    with urllib.request.urlopen(read_only + "/api/users", timeout=10) as answer:
        assert json.load(answer)["data"]["unconfirmed"] == ["walk-in"]


def test_topics_and_groups_show_their_namespace_and_link_by_stored_name(cluster, read_only, browser):
    cluster.create_topic("tenant-a%ledger", 2)
    cluster.create_group("tenant-a%auditors")
    browser.get(read_only + "/topics")
    ledger = wait_for(lambda: [r for r in rows_of(browser, "topic-table") if r[:2] == ["ledger", "tenant-a"]],
                      "tenant-a's ledger in the topic table")
    assert ledger[0][3] == "broker-a: 2", ledger
    assert "topic=tenant-a%25ledger" in browser.find_element(By.LINK_TEXT, "ledger").get_attribute("href")
    browser.get(read_only + "/groups")
    assert ["auditors", "tenant-a"] in [r[:2] for r in rows_of(browser, "group-table")]


def test_a_topic_created_in_the_browser_is_in_admin_topic_list(cluster, read_write, browser):
    browser.get(read_write + "/topics")
    answer = submit(browser, "/api/topics/create", name="made-in-ui", queues="2")
    assert "topic made-in-ui created on broker groups broker-a" in answer
    assert "made-in-ui" in admin_topic_list(cluster)
    wait_for(lambda: any(r[0] == "made-in-ui" and r[3] == "broker-a: 2" for r in rows_of(browser, "topic-table")),
             "the new topic in the live topic table")


def test_read_only_dashboard_refuses_changes_with_403_naming_the_flag(read_only, browser):
    request = urllib.request.Request(read_only + "/api/topics/create", data=json.dumps({"name": "nope"}).encode(),
                                     method="POST")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 403
    assert "--allow-changes" in json.loads(refused.value.read())["message"]
    browser.get(read_only + "/topics")
    assert not browser.find_elements(By.CSS_SELECTOR, "form[data-action]")
    assert "--allow-changes" in browser.find_element(By.CSS_SELECTOR, "p.hint").text


def post(url: str, body: bytes, **headers: str) -> tuple[int, str]:
    request = urllib.request.Request(url, data=body, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())["message"]
    except urllib.error.HTTPError as refused:
        return refused.code, json.loads(refused.read())["message"]


def test_changes_posted_by_another_site_or_not_as_json_are_refused(cluster, read_write):
    body = json.dumps({"name": "forged"}).encode()
    code, message = post(read_write + "/api/topics/create", body, **{"Content-Type": "text/plain"})
    assert code == 403 and "Content-Type: application/json" in message, message
    code, message = post(read_write + "/api/topics/create", body, **{"Content-Type": "application/json",
                                                                     "Origin": "http://attacker.example"})
    assert code == 403 and "from another site (http://attacker.example) is refused" in message, message
    assert "forged" not in admin_topic_list(cluster)


def test_a_message_resent_and_a_topic_deleted_in_the_browser(cluster, read_write, browser):
    browser.get(read_write + "/messages?topic=orders&key=order-3")
    browser.find_element(By.CSS_SELECTOR, "#messages a").click()
    wait_for(lambda: text_of(browser, "body"), "the message page")
    answer = submit(browser, "/api/messages/resend")
    assert answer.startswith("message ") and " resent as " in answer, answer
    browser.get(read_write + "/messages?topic=orders&key=order-3")
    copies = wait_for(lambda: len(rows_of(browser, "messages")) == 2 and rows_of(browser, "messages"),
                      "the original and its resent copy under key order-3")
    assert {row[6] for row in copies} == {"order-3"}

    browser.get(read_write + "/topics")
    submit(browser, "/api/topics/create", name="short-lived", queues="1")
    browser.execute_script("window.confirm = () => true")  # the delete button asks first
    wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, 'form[data-action="/api/topics/delete"] '
                                           'input[value="short-lived"]'), "short-lived's delete button")
    form = browser.find_element(By.XPATH, '//form[@data-action="/api/topics/delete"][input[@value="short-lived"]]')
    browser.execute_script("document.getElementById('flash').hidden = true")
    form.find_element(By.TAG_NAME, "button").click()
    answer = wait_for(lambda: browser.find_element(By.ID, "flash").is_displayed() and text_of(browser, "flash"),
                      "an answer to the delete")
    assert "topic short-lived deleted on broker groups broker-a" in answer, answer
    assert "short-lived" not in admin_topic_list(cluster)


def test_bad_input_gets_a_clear_message_and_the_server_goes_on(read_write, browser):
    browser.get(read_write + "/topics")
    answer = submit(browser, "/api/topics/create", name="bad name!", queues="2")
    assert "illegal topic name 'bad name!'" in answer and "^[%|a-zA-Z0-9_-]+$" in answer, answer
    answer = submit(browser, "/api/topics/create", name="fine", queues="5000")
    assert "queue_nums 5000 is out of range: use 1..1024" in answer, answer
    browser.get(read_write + "/messages?topic=orders&id=01NOSUCHMESSAGE")
    assert "no message with id 01NOSUCHMESSAGE in topic orders" in text_of(browser, "error")
    browser.get(read_write + "/groups?group=nobody")
    assert "No consumer group nobody" in text_of(browser, "progress")
    browser.get(read_write + "/")
    assert len(wait_for(lambda: rows_of(browser, "replicas-broker-a"), "the cluster page after bad input")) == 3


def test_a_killed_master_shows_as_a_leader_change_on_the_raft_view(cluster, read_only, browser):
    old = cluster.master()
    browser.get(read_only + "/")
    wait_for(lambda: f"master (none) \u2192 {old}" in text_of(browser, "changes"), "the first master on the timeline")
    cluster.kill(old)
    new = cluster.wait_master(timeout_s=20, not_id=old)
    change = wait_for(lambda: [r for r in rows_of(browser, "changes") if r[3].startswith(f"master {old} \u2192")],
                      f"master {old} -> {new} in the live Raft view")
    assert change[0][3].startswith((f"master {old} \u2192 {new}", f"master {old} \u2192 (none"))
    wait_for(lambda: any(r[3].startswith(f"master (none: election) \u2192 {new}") or
                         r[3].startswith(f"master {old} \u2192 {new}") for r in rows_of(browser, "changes")),
             f"{new} as master in the live Raft view")
    wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "#raft-svg line.master"), "the master line in the SVG")
