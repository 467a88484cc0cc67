"""A STAND-IN for Confluent's Schema Registry, for pg_cdc's tests only.

No Confluent-compatible registry can be installed on these machines (Confluent's artifacts are not
served; Apicurio's app cannot be assembled from Maven Central; Karapace is not on PyPI; the Go
module proxy refuses the Go implementations). So this speaks the part of the Schema Registry REST API
that pg_cdc and the consumers of its topics use, and nothing more:

    GET    /subjects                                   subjects
    POST   /subjects/{subject}/versions                register (same schema, same id; new: next id)
    POST   /subjects/{subject}                         look a schema up in a subject
    GET    /subjects/{subject}/versions                versions
    GET    /subjects/{subject}/versions/{v|latest}     one version
    DELETE /subjects/{subject}[/versions/{v}]          soft delete (?permanent=true: hard)
    GET    /schemas/ids/{id}                           a schema by id
    GET    /schemas/ids/{id}/versions, .../subjects    where an id is used
    GET    /schemas/types                              ["AVRO", "JSON", "PROTOBUF"]
    GET    /config, /config/{subject}                  compatibility level (subject's, else global)
    PUT    /config, /config/{subject}                  set it
    DELETE /config/{subject}                           back to the global level

It keeps the compatibility level a client sets but never checks a schema against it: the
compatibility rules of pg_cdc's tests are pg_cdc's own (its schema history), not the stand-in's.
What counts is that confluent-kafka's own SchemaRegistryClient, AvroSerializer and AvroDeserializer
work against it unchanged (tests/e2e/test_schema_registry_standin.py).

Ids are global and never reused, like the real registry's; the state is written to a JSON file
after every change, so a restart keeps the ids (as the real one, whose state lives in Kafka).

    python3 standin.py --port 8081 --state /var/tmp/pg_cdc/schema-registry/state.json
"""
import argparse
import hashlib
import json
import os
import re
import sys
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlparse

LEVELS = {"BACKWARD", "BACKWARD_TRANSITIVE", "FORWARD", "FORWARD_TRANSITIVE", "FULL", "FULL_TRANSITIVE", "NONE"}
CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"


class Error(Exception):
    def __init__(self, status, code, message):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def canonical(schema, schema_type):
    """The text a schema is compared by: JSON schemas (Avro, JSON Schema) without insignificant
    whitespace; others as given."""
    if schema_type in ("AVRO", "JSON"):
        try:
            return json.dumps(json.loads(schema), separators=(",", ":"), sort_keys=False)
        except ValueError as e:
            raise Error(422, 42201, f"Invalid schema: {e}") from None
    return schema


class Registry:
    def __init__(self, path):
        self.path = path
        self.lock = threading.Lock()
        self.schemas = {}   # id -> {"schema", "schemaType", "references", "guid"}
        self.subjects = {}  # subject -> [{"version", "id", "deleted"}]
        self.config = {}    # subject -> level
        self.level = "BACKWARD"
        self.next_id = 1
        if path and os.path.exists(path):
            with open(path) as f:
                s = json.load(f)
            self.schemas = {int(k): v for k, v in s["schemas"].items()}
            self.subjects, self.config = s["subjects"], s["config"]
            self.level, self.next_id = s["level"], s["next_id"]

    def save(self):
        if not self.path:
            return
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"schemas": self.schemas, "subjects": self.subjects, "config": self.config,
                       "level": self.level, "next_id": self.next_id}, f)
        os.replace(tmp, self.path)

    def id_of(self, text, schema_type, references):
        for i, s in self.schemas.items():
            if s["canonical"] == text and s["schemaType"] == schema_type and s["references"] == references:
                return i
        return None

    def live(self, subject, deleted=False):
        versions = [v for v in self.subjects.get(subject, []) if deleted or not v["deleted"]]
        if not versions:
            raise Error(404, 40401, f"Subject '{subject}' not found.")
        return versions

    def version(self, subject, v, deleted=False):
        versions = self.live(subject, deleted)
        if v in ("latest", "-1"):
            return versions[-1]
        try:
            n = int(v)
        except ValueError:
            raise Error(422, 42202, f"The specified version '{v}' is not a valid version id.") from None
        for entry in versions:
            if entry["version"] == n:
                return entry
        raise Error(404, 40402, f"Version {n} not found.")

    def view(self, subject, entry):
        s = self.schemas[entry["id"]]
        out = {"subject": subject, "version": entry["version"], "id": entry["id"], "guid": s["guid"],
               "schema": s["schema"]}
        if s["schemaType"] != "AVRO":
            out["schemaType"] = s["schemaType"]
        if s["references"]:
            out["references"] = s["references"]
        return out

    def register(self, subject, body):
        schema_type = body.get("schemaType") or "AVRO"
        if "schema" not in body or not isinstance(body["schema"], str):
            raise Error(422, 42201, "Invalid schema: a string \"schema\" is required")
        references = body.get("references") or []
        text = canonical(body["schema"], schema_type)
        sid = self.id_of(text, schema_type, references)
        versions = self.subjects.setdefault(subject, [])
        if sid is not None:
            for entry in versions:
                if entry["id"] == sid and not entry["deleted"]:
                    return {"id": sid}
        if sid is None:
            sid = self.next_id
            self.next_id += 1
            guid = str(uuid.UUID(bytes=hashlib.md5(text.encode()).digest()))
            self.schemas[sid] = {"schema": body["schema"], "canonical": text, "schemaType": schema_type,
                                 "references": references, "guid": guid}
        number = max((v["version"] for v in versions), default=0) + 1
        versions.append({"version": number, "id": sid, "deleted": False})
        self.save()
        return {"id": sid, "subject": subject, "version": number, "guid": self.schemas[sid]["guid"],
                "schema": body["schema"]}

    def lookup(self, subject, body, deleted):
        schema_type = body.get("schemaType") or "AVRO"
        text = canonical(body.get("schema", ""), schema_type)
        for entry in self.live(subject, deleted):
            if self.schemas[entry["id"]]["canonical"] == text:
                return self.view(subject, entry)
        raise Error(404, 40403, "Schema not found")

    def delete(self, subject, version, permanent):
        versions = self.subjects.get(subject)
        if not versions:
            raise Error(404, 40401, f"Subject '{subject}' not found.")
        targets = versions if version is None else [self.version(subject, version, deleted=True)]
        gone = []
        for entry in list(targets):
            if permanent:
                if not entry["deleted"]:
                    raise Error(409, 40405, f"Subject '{subject}' Version {entry['version']} was not deleted "
                                            "first before being permanently deleted")
                versions.remove(entry)
            else:
                entry["deleted"] = True
            gone.append(entry["version"])
        if not versions:
            self.subjects.pop(subject, None)
        self.save()
        return gone if version is None else gone[0]


class Handler(BaseHTTPRequestHandler):
    registry = None
    server_version = "pg_cdc-schema-registry-standin/1"

    def log_message(self, fmt, *args):
        sys.stderr.write("%s %s\n" % (self.log_date_time_string(), fmt % args))

    def reply(self, status, payload):
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", CONTENT_TYPE)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def body(self):
        n = int(self.headers.get("Content-Length") or 0)
        if not n:
            return {}
        try:
            return json.loads(self.rfile.read(n))
        except ValueError:
            raise Error(400, 50005, "Unrecognized request body") from None

    def handle_any(self, method):
        url = urlparse(self.path)
        parts = [unquote(p) for p in url.path.strip("/").split("/") if p]
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        flag = lambda k: query.get(k, "false").lower() == "true"  # noqa: E731
        r = self.registry
        try:
            with r.lock:
                self.reply(200, self.route(method, parts, query, flag, r))
        except Error as e:
            self.reply(e.status, {"error_code": e.code, "message": e.message})
        except Exception as e:  # a bug here must not look like a registry answer
            self.reply(500, {"error_code": 50001, "message": f"stand-in failure: {e!r}"})

    def route(self, method, parts, query, flag, r):
        match (method, parts):
            case ("GET", ["subjects"]):
                return sorted(s for s in r.subjects if flag("deleted") or any(not v["deleted"] for v in r.subjects[s]))
            case ("POST", ["subjects", subject, "versions"]):
                return r.register(subject, self.body())
            case ("POST", ["subjects", subject]):
                return r.lookup(subject, self.body(), flag("deleted"))
            case ("GET", ["subjects", subject, "versions"]):
                return [v["version"] for v in r.live(subject, flag("deleted"))]
            case ("GET", ["subjects", subject, "versions", version]):
                return r.view(subject, r.version(subject, version, flag("deleted")))
            case ("GET", ["subjects", subject, "versions", version, "schema"]):
                return json.loads(r.schemas[r.version(subject, version)["id"]]["schema"])
            case ("DELETE", ["subjects", subject]):
                return r.delete(subject, None, flag("permanent"))
            case ("DELETE", ["subjects", subject, "versions", version]):
                return r.delete(subject, version, flag("permanent"))
            case ("GET", ["schemas", "types"]):
                return ["AVRO", "JSON", "PROTOBUF"]
            case ("GET", ["schemas", "ids", sid, *rest]):
                try:
                    s = r.schemas[int(sid)]
                except (ValueError, KeyError):
                    raise Error(404, 40403, "Schema not found") from None
                uses = [(subj, v["version"]) for subj, vs in r.subjects.items() for v in vs if v["id"] == int(sid)]
                if rest == ["versions"]:
                    return [{"subject": subj, "version": n} for subj, n in uses]
                if rest == ["subjects"]:
                    return sorted({subj for subj, _ in uses})
                if rest:
                    raise Error(404, 404, "HTTP 404 Not Found")
                out = {"schema": s["schema"], "guid": s["guid"]}
                if s["schemaType"] != "AVRO":
                    out["schemaType"] = s["schemaType"]
                if s["references"]:
                    out["references"] = s["references"]
                return out
            case ("GET", ["config"]):
                return {"compatibilityLevel": r.level}
            case ("GET", ["config", subject]):
                if subject in r.config:
                    return {"compatibilityLevel": r.config[subject]}
                if flag("defaultToGlobal"):
                    return {"compatibilityLevel": r.level}
                raise Error(404, 40408, f"Subject '{subject}' does not have subject-level compatibility configured")
            case ("PUT", ["config", *subject]) if len(subject) <= 1:
                level = str(self.body().get("compatibility", "")).upper()
                if level not in LEVELS:
                    raise Error(422, 42203, "Invalid compatibility level. Valid values are none, backward, forward, "
                                            "full, backward_transitive, forward_transitive, and full_transitive")
                if subject:
                    r.config[subject[0]] = level
                else:
                    r.level = level
                r.save()
                return {"compatibility": level}
            case ("DELETE", ["config", subject]):
                level = r.config.pop(subject, None)
                if level is None:
                    raise Error(404, 40401, f"Subject '{subject}' not found.")
                r.save()
                return {"compatibilityLevel": level}
            case ("GET", []):
                return {}
        raise Error(404, 404, "HTTP 404 Not Found (not part of the stand-in)")

    def do_GET(self):
        self.handle_any("GET")

    def do_POST(self):
        self.handle_any("POST")

    def do_PUT(self):
        self.handle_any("PUT")

    def do_DELETE(self):
        self.handle_any("DELETE")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8081)
    p.add_argument("--state", default="", help="JSON file that keeps the registry across restarts")
    a = p.parse_args()
    Handler.registry = Registry(a.state)
    server = ThreadingHTTPServer((a.host, a.port), Handler)
    server.daemon_threads = True
    print(f"schema registry stand-in on http://{a.host}:{a.port} (state {a.state or 'in memory'})", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
