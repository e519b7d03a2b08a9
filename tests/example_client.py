"""An example client of the JSON API (httpx): list the pending approvals, or decide one.

    python tests/example_client.py --url http://127.0.0.1:8000 --token art_... list
    python tests/example_client.py --url ... --token ... approve 42
    python tests/example_client.py --url ... --token ... reject 42 --note "not ours"

It decides on what it read: the approval's digest goes back as ``expected_digest``, so a
request that changed meanwhile is refused (409 stale), and an ``Idempotency-Key`` makes a
retried decision (a timeout, a dropped connection) safe to send again.
"""

from __future__ import annotations

import argparse
import json
import sys
import uuid

import httpx


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True, help="the console, e.g. http://127.0.0.1:8000")
    parser.add_argument("--token", required=True, help="an API token (manage.py apitoken)")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="the pending approvals, oldest first")
    for name in ("approve", "reject"):
        cmd = sub.add_parser(name, help=f"{name} an approval")
        cmd.add_argument("id", type=int)
        cmd.add_argument("--note", default="")
    args = parser.parse_args(argv)

    headers = {"Authorization": f"Bearer {args.token}"}
    with httpx.Client(base_url=args.url.rstrip("/") + "/api", headers=headers,
                      timeout=30) as api:
        if args.command == "list":
            cursor = None
            while True:
                params = {"limit": 100, **({"cursor": cursor} if cursor else {})}
                page = _ok(api.get("/approvals/", params=params))
                for item in page["items"]:
                    print(f"{item['id']}\trun {item['run_id']}\t{item['agent']}\t"
                          f"{item['kind']}\t{item['tool']}\t{item['title']}")
                cursor = page["next_cursor"]
                if not cursor:
                    return 0
        approval = _ok(api.get(f"/approvals/{args.id}"))
        body = {"decision": args.command, "expected_digest": approval["digest"],
                "note": args.note}
        key = str(uuid.uuid4())
        for _ in range(3):  # retried with the same key: decided at most once
            try:
                response = api.post(f"/approvals/{args.id}/decide", json=body,
                                    headers={"Idempotency-Key": key})
            except httpx.TransportError as exc:
                print(f"retrying after {exc!r}", file=sys.stderr)
                continue
            if response.status_code == 409 and response.json().get("code") == "retry":
                continue
            break
        else:
            print("gave up", file=sys.stderr)
            return 1
        data = response.json()
        if response.status_code != 200:
            print(json.dumps(data, indent=2), file=sys.stderr)
            return 2
        print(f"approval {data['id']}: {data['status']} by {data['decided_by']}")
        return 0


def _ok(response: httpx.Response) -> dict:
    if response.status_code != 200:
        print(json.dumps(response.json(), indent=2), file=sys.stderr)
        raise SystemExit(2)
    return response.json()


if __name__ == "__main__":
    sys.exit(main())
