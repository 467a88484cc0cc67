package io.pgcdc.bench;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import java.util.Map;

import org.apache.kafka.connect.data.SchemaAndValue;
import org.apache.kafka.connect.json.JsonConverter;
import org.apache.kafka.connect.sink.SinkRecord;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;

import io.debezium.transforms.ExtractNewRecordState;

/**
 * Reads change records the way a Kafka Connect sink connector over a Debezium topic does (the
 * e2e test of pg_cdc's {@code format: debezium}): Kafka Connect's own {@link JsonConverter}
 * (schemas enabled) turns each record's key and value bytes into Connect data, checking them
 * against their schemas, then Debezium's {@link ExtractNewRecordState} (the "unwrap" transform
 * such sinks use, with its defaults) turns the change event into the row's new state.
 *
 * <p>Input on stdin, one record per line: {@code {"key": KEY, "value": VALUE}} (a tombstone's
 * value {@code null}). Output on stdout, one line per record the transform keeps:
 * {@code {"key": ..., "value": ...}} written by a JsonConverter without schemas, decimals as
 * numbers, or {@code {"error": "..."}} for a record Connect or the transform refused.
 */
public final class ConnectRead {

    private ConnectRead() {
    }

    public static void main(String[] args) throws Exception {
        String topic = args.length > 0 ? args[0] : "pg_cdc";
        ObjectMapper mapper = new ObjectMapper();
        JsonConverter keyIn = converter(true, true);
        JsonConverter valueIn = converter(false, true);
        JsonConverter keyOut = converter(true, false);
        JsonConverter valueOut = converter(false, false);
        try (ExtractNewRecordState<SinkRecord> unwrap = new ExtractNewRecordState<>()) {
            unwrap.configure(new HashMap<>());
            BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
            long offset = 0;
            for (String line; (line = in.readLine()) != null; offset++) {
                if (line.isBlank()) {
                    continue;
                }
                try {
                    JsonNode r = mapper.readTree(line);
                    SchemaAndValue key = keyIn.toConnectData(topic, bytes(mapper, r.get("key")));
                    SchemaAndValue value = valueIn.toConnectData(topic, bytes(mapper, r.get("value")));
                    SinkRecord record = new SinkRecord(topic, 0, key.schema(), key.value(), value.schema(),
                            value.value(), offset);
                    SinkRecord out = unwrap.apply(record);
                    if (out == null) {
                        continue;
                    }
                    byte[] k = keyOut.fromConnectData(topic, out.keySchema(), out.key());
                    byte[] v = valueOut.fromConnectData(topic, out.valueSchema(), out.value());
                    System.out.println("{\"key\": " + text(k) + ", \"value\": " + text(v) + "}");
                } catch (RuntimeException e) {
                    System.out.println(mapper.writeValueAsString(Map.of("error", String.valueOf(e))));
                }
            }
        }
    }

    private static JsonConverter converter(boolean isKey, boolean schemas) {
        JsonConverter c = new JsonConverter();
        Map<String, Object> config = new HashMap<>();
        config.put("schemas.enable", schemas);
        config.put("decimal.format", "NUMERIC");
        c.configure(config, isKey);
        return c;
    }

    private static byte[] bytes(ObjectMapper mapper, JsonNode node) throws Exception {
        return node == null || node.isNull() ? null : mapper.writeValueAsBytes(node);
    }

    private static String text(byte[] b) {
        return b == null ? "null" : new String(b, StandardCharsets.UTF_8);
    }
}
