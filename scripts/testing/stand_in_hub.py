#!/usr/bin/env python3
"""A stand-in for the Hugging Face Hub's dataset endpoints, on 127.0.0.1, for siphon's tests.

    stand_in_hub.py ROOT PORT [--token TOKEN] [--page-size N]

ROOT holds one directory per dataset revision: ROOT/OWNER/NAME/REVISION/... (a revision with
slashes, like refs/convert/parquet, is a directory path too). ROOT/OWNER/NAME/REVISION.card.json,
when present, is the dataset card's metadata (`cardData`). It answers what siphon asks, the way
the Hub answers it:

- GET /api/datasets/OWNER/NAME/revision/REV: {"id", "sha", "cardData"?};
- GET /api/datasets/OWNER/NAME/tree/REV[/PATH]?recursive=true: the entries under PATH,
  `page-size` per page, the next page in a `Link: <...>; rel="next"` header;
- GET|HEAD /datasets/OWNER/NAME/resolve/REV/PATH: a parquet file redirects (302, absolute
  Location) to /cdn/..., as the Hub sends LFS files to its CDN; other files are answered here;
- GET|HEAD /cdn/...: the bytes, with single `Range: bytes=a-b` requests answered 206.

With --token, the API and resolve endpoints answer 401 without `Authorization: Bearer TOKEN`.
REV is URL-decoded (refs%2Fconvert%2Fparquet). Every request is logged to stderr.
"""

import argparse
import hashlib
import json
import os
import sys
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("root")
    parser.add_argument("port", type=int)
    parser.add_argument("--token")
    parser.add_argument("--page-size", type=int, default=2)
    args = parser.parse_args()
    root = os.path.abspath(args.root)

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, fmt: str, *a: object) -> None:
            sys.stderr.write("stand-in hub: " + fmt % a + "\n")

        def send(self, status: int, body: bytes = b"", headers: dict | None = None) -> None:
            self.send_response(status)
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def authorized(self) -> bool:
            if args.token is None or self.headers.get("Authorization") == f"Bearer {args.token}":
                return True
            self.send(401, b'{"error": "Invalid credentials"}', {"Content-Type": "application/json"})
            return False

        def do_HEAD(self) -> None:
            self.do_GET()

        def do_GET(self) -> None:
            url = urllib.parse.urlsplit(self.path)
            parts = url.path.split("/")[1:]
            query = urllib.parse.parse_qs(url.query)
            if parts[:2] == ["api", "datasets"] and len(parts) >= 6:
                if not self.authorized():
                    return
                owner, name, what, rev = parts[2], parts[3], parts[4], urllib.parse.unquote(parts[5])
                base = os.path.join(root, owner, name, rev)
                if not os.path.isdir(base):
                    return self.send(404, b'{"error": "Revision not found"}')
                if what == "revision":
                    info = {"id": f"{owner}/{name}", "sha": hashlib.sha1(rev.encode()).hexdigest()}
                    card = base + ".card.json"
                    if os.path.exists(card):
                        with open(card) as f:
                            info["cardData"] = json.load(f)
                    return self.send(200, json.dumps(info).encode(), {"Content-Type": "application/json"})
                if what == "tree":
                    return self.tree(base, "/".join(urllib.parse.unquote(p) for p in parts[6:]), query, url.path)
            elif parts[:1] == ["datasets"] and len(parts) >= 6 and parts[3] == "resolve":
                if not self.authorized():
                    return
                owner, name, rev = parts[1], parts[2], urllib.parse.unquote(parts[4])
                rel = "/".join(urllib.parse.unquote(p) for p in parts[5:])
                path = os.path.join(root, owner, name, rev, rel)
                if not os.path.isfile(path):
                    return self.send(404, b"Entry not found", {"X-Error-Code": "EntryNotFound"})
                if rel.endswith(".parquet"):
                    cdn = "/cdn/" + "/".join(urllib.parse.quote(p, safe="") for p in [owner, name, rev] + rel.split("/"))
                    host = self.headers.get("Host", f"127.0.0.1:{args.port}")
                    return self.send(302, b"", {"Location": f"http://{host}{cdn}"})
                return self.file(path)
            elif parts[:1] == ["cdn"]:
                path = os.path.join(root, *(urllib.parse.unquote(p) for p in parts[1:]))
                if os.path.isfile(path):
                    return self.file(path)
            self.send(404, b"not found")

        def tree(self, base: str, sub: str, query: dict, path: str) -> None:
            top = os.path.join(base, sub)
            if not os.path.isdir(top):
                return self.send(404, b'{"error": "Entry not found"}')
            entries = []
            recursive = query.get("recursive", ["false"])[0] == "true"
            for dirpath, dirnames, filenames in os.walk(top):
                dirnames.sort()
                for d in dirnames:
                    entries.append({"type": "directory", "oid": "0" * 40, "size": 0,
                                    "path": os.path.relpath(os.path.join(dirpath, d), base)})
                for f in sorted(filenames):
                    full = os.path.join(dirpath, f)
                    size = os.path.getsize(full)
                    entry = {"type": "file", "oid": hashlib.sha1(full.encode()).hexdigest(), "size": size,
                             "path": os.path.relpath(full, base)}
                    if f.endswith(".parquet"):
                        entry["lfs"] = {"oid": hashlib.sha256(full.encode()).hexdigest(), "size": size,
                                        "pointerSize": 134}
                    entries.append(entry)
                if not recursive:
                    break
            start = int(query.get("cursor", ["0"])[0])
            page = entries[start:start + args.page_size]
            headers = {"Content-Type": "application/json"}
            if start + args.page_size < len(entries):
                params = {"recursive": query.get("recursive", ["false"])[0], "cursor": start + args.page_size}
                host = self.headers.get("Host", f"127.0.0.1:{args.port}")
                headers["Link"] = f'<http://{host}{path}?{urllib.parse.urlencode(params)}>; rel="next"'
            self.send(200, json.dumps(page).encode(), headers)

        def file(self, path: str) -> None:
            with open(path, "rb") as f:
                data = f.read()
            headers = {"ETag": '"' + hashlib.sha1(data).hexdigest() + '"', "Accept-Ranges": "bytes"}
            ranged = self.headers.get("Range")
            if ranged and ranged.startswith("bytes="):
                first, _, last = ranged[len("bytes="):].partition("-")
                start = int(first) if first else len(data) - int(last)
                end = int(last) if first and last else len(data) - 1
                end = min(end, len(data) - 1)
                if start >= len(data):
                    return self.send(416, b"", {"Content-Range": f"bytes */{len(data)}"})
                headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
                return self.send(206, data[start:end + 1], headers)
            self.send(200, data, headers)

    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.serve_forever()


if __name__ == "__main__":
    main()
