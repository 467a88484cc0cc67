package io.pgcdc.bench;

import java.io.BufferedReader;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.PrintWriter;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.util.Base64;
import java.util.Map;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;

import io.apicurio.registry.utils.converter.avro.AvroData;
import org.apache.avro.generic.GenericDatumWriter;
import org.apache.avro.io.BinaryEncoder;
import org.apache.avro.io.EncoderFactory;
import org.apache.kafka.connect.data.SchemaAndValue;
import org.apache.kafka.connect.json.JsonConverter;

/**
 * What Kafka Connect's Avro converter writes for Debezium's records: the oracle of pg_cdc's
 * {@code format: debezium} with {@code converter: avro}. Confluent's AvroConverter is not served
 * from Maven Central; Apicurio's converter module (which is) carries a port of the same AvroData,
 * the Connect-to-Avro mapping the converter applies before it registers the schema and writes the
 * datum. Reads a capture of {@link DebeziumCapture} made with schemas (Connect's JSON converter),
 * turns each key and value back into Connect data with the JSON converter, maps it with AvroData
 * (its defaults: Connect metadata kept), and writes one line per record:
 * {@code {"key_schema": AVRO_SCHEMA, "key": BASE64_DATUM, "value_schema": ..., "value": ...}}
 * (a tombstone's value and schema are {@code null}).
 *
 * <p>Usage: {@code AvroOracle IN_FILE OUT_FILE}.
 */
public final class AvroOracle {

    private AvroOracle() {
    }

    public static void main(String[] args) throws IOException {
        if (args.length != 2) {
            System.err.println("usage: AvroOracle IN_FILE OUT_FILE");
            System.exit(2);
        }
        ObjectMapper mapper = new ObjectMapper();
        JsonConverter keys = new JsonConverter();
        keys.configure(Map.of("schemas.enable", "true"), true);
        JsonConverter values = new JsonConverter();
        values.configure(Map.of("schemas.enable", "true"), false);
        AvroData avro = new AvroData(100);
        try (BufferedReader in = Files.newBufferedReader(Paths.get(args[0]), StandardCharsets.UTF_8);
                PrintWriter out = new PrintWriter(Files.newBufferedWriter(Paths.get(args[1]), StandardCharsets.UTF_8))) {
            String line;
            while ((line = in.readLine()) != null) {
                if (line.isBlank()) {
                    continue;
                }
                JsonNode record = mapper.readTree(line);
                ObjectNode result = mapper.createObjectNode();
                write(mapper, avro, keys, record.get("key"), result, "key");
                write(mapper, avro, values, record.get("value"), result, "value");
                out.println(mapper.writeValueAsString(result));
            }
        }
    }

    private static void write(ObjectMapper mapper, AvroData avro, JsonConverter converter, JsonNode json,
            ObjectNode result, String field) throws IOException {
        if (json == null || json.isNull()) {
            result.putNull(field + "_schema");
            result.putNull(field);
            return;
        }
        SchemaAndValue connect = converter.toConnectData("golden", mapper.writeValueAsBytes(json));
        org.apache.avro.Schema schema = avro.fromConnectSchema(connect.schema());
        Object datum = avro.fromConnectData(connect.schema(), connect.value());
        ByteArrayOutputStream bytes = new ByteArrayOutputStream();
        BinaryEncoder encoder = EncoderFactory.get().binaryEncoder(bytes, null);
        new GenericDatumWriter<Object>(schema).write(datum, encoder);
        encoder.flush();
        result.set(field + "_schema", mapper.readTree(schema.toString()));
        result.put(field, Base64.getEncoder().encodeToString(bytes.toByteArray()));
    }
}
