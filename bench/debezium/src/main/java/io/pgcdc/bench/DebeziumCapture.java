package io.pgcdc.bench;

import java.io.PrintWriter;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.util.List;
import java.util.Properties;

import io.debezium.engine.ChangeEvent;
import io.debezium.engine.DebeziumEngine;

/**
 * Records what Debezium writes for a workload, as the oracle of pg_cdc's {@code format: debezium}
 * (scripts/capture-debezium.sh). Runs the Debezium embedded engine with the PostgreSQL connector
 * and writes every change record, as Debezium's JSON converter serialized key and value, to a
 * file: one line per record, {@code {"key": KEY, "value": VALUE}} (a tombstone's value is
 * {@code null}). The file is flushed after every batch.
 *
 * <p>Usage: {@code DebeziumCapture ENGINE_PROPERTIES OUT_FILE}. Prints {@code READY} once the
 * engine polls the connector, and runs until its standard input is closed.
 */
public final class DebeziumCapture {

    private DebeziumCapture() {
    }

    public static void main(String[] args) throws Exception {
        if (args.length != 2) {
            System.err.println("usage: DebeziumCapture ENGINE_PROPERTIES OUT_FILE");
            System.exit(2);
        }
        Properties engineProps = DebeziumBench.load(args[0]);
        Throwable failure;
        try (PrintWriter out = new PrintWriter(Files.newBufferedWriter(Paths.get(args[1]), StandardCharsets.UTF_8))) {
            failure = DebeziumBench.runUntilStdinCloses(engineProps,
                    (List<ChangeEvent<String, String>> records,
                            DebeziumEngine.RecordCommitter<ChangeEvent<String, String>> committer) -> {
                        synchronized (out) {
                            for (ChangeEvent<String, String> r : records) {
                                out.println("{\"key\": " + r.key() + ", \"value\": " + r.value() + "}");
                                committer.markProcessed(r);
                            }
                            out.flush();
                        }
                        committer.markBatchFinished();
                    }, out::flush);
        }
        if (failure != null) {
            failure.printStackTrace();
            System.exit(1);
        }
    }
}
