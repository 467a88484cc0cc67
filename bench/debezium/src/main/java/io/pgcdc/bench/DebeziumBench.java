package io.pgcdc.bench;

import java.io.FileInputStream;
import java.io.IOException;
import java.io.InputStream;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicReference;

import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.serialization.StringSerializer;

import io.debezium.engine.ChangeEvent;
import io.debezium.engine.DebeziumEngine;
import io.debezium.engine.format.Json;

/**
 * The Debezium side of pg_cdc's end-to-end benchmark (bench/e2e_bench.py).
 *
 * <p>Runs the Debezium embedded engine (the asynchronous engine of debezium-embedded) with the
 * PostgreSQL connector and forwards every change record, as the JSON converter serialized it, to
 * one Kafka topic with a {@link KafkaProducer}. Each batch the engine hands over is sent
 * asynchronously, then every send is awaited before the batch's records are marked processed, the
 * way Debezium Server's Kafka sink does it: at-least-once delivery.
 *
 * <p>Usage: {@code DebeziumBench ENGINE_PROPERTIES PRODUCER_PROPERTIES TOPIC}. Prints {@code READY}
 * on stdout once the engine polls the connector, and runs until its standard input is closed (or
 * it gets SIGTERM); it then stops the engine and flushes the producer. Exits non-zero if the
 * engine or the producer failed.
 */
public final class DebeziumBench {

    private DebeziumBench() {
    }

    public static void main(String[] args) throws Exception {
        if (args.length != 3) {
            System.err.println("usage: DebeziumBench ENGINE_PROPERTIES PRODUCER_PROPERTIES TOPIC");
            System.exit(2);
        }
        Properties engineProps = load(args[0]);
        Properties producerProps = load(args[1]);
        String topic = args[2];

        KafkaProducer<String, String> producer =
                new KafkaProducer<>(producerProps, new StringSerializer(), new StringSerializer());
        Throwable failure = runUntilStdinCloses(engineProps, new KafkaForwarder(producer, topic), producer::close);
        if (failure != null) {
            failure.printStackTrace();
            System.exit(1);
        }
    }

    /**
     * Runs the embedded engine with {@code engineProps}, handing every batch to {@code consumer};
     * prints {@code READY} once the engine polls the connector, and stops the engine when standard
     * input closes, the engine dies, or the JVM gets SIGTERM; then runs {@code afterStop} (once).
     * Returns the engine's failure, if any.
     */
    static Throwable runUntilStdinCloses(Properties engineProps,
            DebeziumEngine.ChangeConsumer<ChangeEvent<String, String>> consumer, Runnable afterStop)
            throws InterruptedException {
        AtomicReference<Throwable> engineFailure = new AtomicReference<>();
        CountDownLatch engineDone = new CountDownLatch(1);

        DebeziumEngine<ChangeEvent<String, String>> engine = DebeziumEngine.create(Json.class)
                .using(engineProps)
                .using(new DebeziumEngine.ConnectorCallback() {
                    @Override
                    public void pollingStarted() {
                        System.out.println("READY");
                        System.out.flush();
                    }
                })
                .using((success, message, error) -> {
                    if (!success) {
                        engineFailure.set(error != null ? error : new IllegalStateException(message));
                    }
                    engineDone.countDown();
                })
                .notifying(consumer)
                .build();

        ExecutorService executor = Executors.newSingleThreadExecutor();
        executor.execute(engine);
        Thread shutdown = new Thread(() -> stop(engine, executor, afterStop));
        Runtime.getRuntime().addShutdownHook(shutdown);

        // The driver closes our stdin to stop us; an engine that dies on its own ends the wait too.
        Thread stdinWatcher = new Thread(() -> {
            try {
                while (System.in.read() != -1) {
                    // discard
                }
            } catch (IOException ignored) {
                // treated like end of input
            }
            engineDone.countDown();
        }, "stdin-watcher");
        stdinWatcher.setDaemon(true);
        stdinWatcher.start();
        engineDone.await();

        stop(engine, executor, afterStop);
        Runtime.getRuntime().removeShutdownHook(shutdown);
        return engineFailure.get();
    }

    /** Stops the engine (idempotent), waits for its thread, then runs {@code afterStop}. */
    private static synchronized void stop(DebeziumEngine<?> engine, ExecutorService executor, Runnable afterStop) {
        if (executor.isShutdown()) {
            return;
        }
        try {
            engine.close();
            executor.shutdown();
            executor.awaitTermination(60, TimeUnit.SECONDS);
        } catch (IOException | InterruptedException e) {
            e.printStackTrace();
        } finally {
            afterStop.run();
        }
    }

    static Properties load(String path) throws IOException {
        Properties props = new Properties();
        try (InputStream in = new FileInputStream(path)) {
            props.load(in);
        }
        return props;
    }

    /** Sends each batch to Kafka and marks it processed once the broker acknowledged every record. */
    static final class KafkaForwarder implements DebeziumEngine.ChangeConsumer<ChangeEvent<String, String>> {
        private final KafkaProducer<String, String> producer;
        private final String topic;

        KafkaForwarder(KafkaProducer<String, String> producer, String topic) {
            this.producer = producer;
            this.topic = topic;
        }

        @Override
        public void handleBatch(List<ChangeEvent<String, String>> records,
                DebeziumEngine.RecordCommitter<ChangeEvent<String, String>> committer) throws InterruptedException {
            List<Future<RecordMetadata>> sends = new ArrayList<>(records.size());
            for (ChangeEvent<String, String> r : records) {
                sends.add(producer.send(new ProducerRecord<>(topic, r.key(), r.value())));
            }
            for (Future<RecordMetadata> f : sends) {
                try {
                    f.get();
                } catch (ExecutionException e) {
                    // Not acknowledged: fail the batch so the engine stops and its offsets stay behind.
                    throw new IllegalStateException("Kafka did not acknowledge a record", e.getCause());
                }
            }
            for (ChangeEvent<String, String> r : records) {
                committer.markProcessed(r);
            }
            committer.markBatchFinished();
        }
    }
}
