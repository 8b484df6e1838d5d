#!/usr/bin/env python3
"""A stand-in for the Hugging Face hub on 127.0.0.1, for the download tests: serves one repo from a
fixture directory through the two endpoints moeserve uses (revision metadata with blob ids and LFS
sha256, and resolve with Range), and can misbehave on purpose.

usage: fake_hub.py FIXTURE_DIR REPO_ID PORT_FILE LOG_FILE
env:   HUB_TOKEN=secret          require "Authorization: Bearer secret" (401 otherwise)
       HUB_CUT=FILE:BYTES        the first GET of FILE stops after BYTES and drops the connection
       HUB_CORRUPT=FILE          FILE's bytes are served with one byte changed
Each request is logged as one line: METHOD PATH range=RANGE auth=0|1."""
import hashlib, http.server, json, os, sys, threading

fixture, repo, port_file, log_file = sys.argv[1:5]
COMMIT = hashlib.sha1(repo.encode()).hexdigest()
files = {}
for name in sorted(os.listdir(fixture)):
    p = os.path.join(fixture, name)
    if not os.path.isfile(p):
        continue
    data = open(p, 'rb').read()
    ent = {'rfilename': name, 'size': len(data),
           'blobId': hashlib.sha1(b'blob %d\0' % len(data) + data).hexdigest()}
    if name.endswith('.safetensors'):
        ent['lfs'] = {'sha256': hashlib.sha256(data).hexdigest(), 'size': len(data)}
    files[name] = (data, ent)
files_meta = [e for _, e in files.values()] + [{'rfilename': 'README.md', 'size': 3, 'blobId': '0' * 40}]
token = os.environ.get('HUB_TOKEN', '')
cut = os.environ.get('HUB_CUT', '')
cut_done = set()
corrupt = os.environ.get('HUB_CORRUPT', '')
lock = threading.Lock()


class H(http.server.BaseHTTPRequestHandler):
    protocol_version = 'HTTP/1.1'

    def log_message(self, *a):
        pass

    def send(self, code, body, ctype='application/json', extra=()):
        self.send_response(code)
        self.send_header('Content-Type', ctype)
        self.send_header('Content-Length', str(len(body)))
        for k, v in extra:
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        auth = self.headers.get('Authorization', '')
        rng = self.headers.get('Range', '')
        with lock, open(log_file, 'a') as f:
            f.write('GET %s range=%s auth=%d\n' % (self.path, rng or '-', 1 if auth else 0))
        if token and auth != 'Bearer ' + token:
            return self.send(401, b'{"error":"Invalid credentials"}')
        path = self.path.split('?')[0]
        api = '/api/models/%s/revision/' % repo
        res = '/%s/resolve/' % repo
        if path.startswith(api):
            body = json.dumps({'id': repo, 'sha': COMMIT, 'siblings': files_meta}).encode()
            return self.send(200, body)
        if path.startswith(res):
            rev, _, name = path[len(res):].partition('/')
            if name not in files:
                return self.send(404, b'{"error":"Entry not found"}')
            data = files[name][0]
            if name == corrupt:
                data = bytes([data[0] ^ 1]) + data[1:]
            start = 0
            if rng.startswith('bytes='):
                start = int(rng[6:].split('-')[0])
                if start >= len(data):
                    return self.send(416, b'')
            part = data[start:]
            self.send_response(206 if start else 200)
            self.send_header('Content-Type', 'application/octet-stream')
            self.send_header('Content-Length', str(len(part)))
            if start:
                self.send_header('Content-Range', 'bytes %d-%d/%d' % (start, len(data) - 1, len(data)))
            self.end_headers()
            if cut and not start:
                cname, _, n = cut.partition(':')
                with lock:
                    first = cname == name and name not in cut_done
                    if first:
                        cut_done.add(name)
                if first:
                    self.wfile.write(part[:int(n)])
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
            self.wfile.write(part)
            return
        return self.send(404, b'{"error":"Repository not found"}')


srv = http.server.ThreadingHTTPServer(('127.0.0.1', 0), H)
with open(port_file + '.tmp', 'w') as f:
    f.write(str(srv.server_address[1]))
os.rename(port_file + '.tmp', port_file)
srv.serve_forever()
