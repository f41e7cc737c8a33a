// The Java producer (Apache Kafka's kafka-clients) writing what a test script says, for
// integration_tests/kafka_source/test_record_batches_differential.py: record batches as the Java client
// builds them, every codec, headers, null keys and values, committed and aborted transactions.
//
// Run as a single source file (Java 17+):
//   java -cp <kafka-broker jars> DifferentialProducer.java <bootstrap servers> <script>
// The script has one tab-separated command per line (bytes in hex, "-" for null):
//   PRODUCER <name> <compression.type> <transactional.id or ->
//   SEND <name> <topic> <partition> <timestamp ms> <key> <value> <headers>
//        headers: comma-separated <key hex>:<value hex or ->, empty for none
//   BEGIN|FLUSH|COMMIT|ABORT <name>
// Exits non-zero (with the exception) if any record or transaction call fails.

import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.HexFormat;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.Future;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.header.internals.RecordHeader;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public class DifferentialProducer {
    private static final HexFormat HEX = HexFormat.of();

    private static byte[] bytes(String field) {
        return field.equals("-") ? null : HEX.parseHex(field);
    }

    private static List<Header> headers(String field) {
        List<Header> headers = new ArrayList<>();
        if (field.isEmpty()) {
            return headers;
        }
        for (String item : field.split(",", -1)) {
            String[] parts = item.split(":", -1);
            String key = new String(HEX.parseHex(parts[0]), StandardCharsets.UTF_8);
            headers.add(new RecordHeader(key, bytes(parts[1])));
        }
        return headers;
    }

    public static void main(String[] args) throws Exception {
        String servers = args[0];
        Map<String, KafkaProducer<byte[], byte[]>> producers = new LinkedHashMap<>();
        List<Future<RecordMetadata>> sent = new ArrayList<>();
        try {
            for (String line : Files.readAllLines(Path.of(args[1]), StandardCharsets.UTF_8)) {
                String[] field = line.split("\t", -1);
                switch (field[0]) {
                    case "PRODUCER" -> {
                        Properties config = new Properties();
                        config.put("bootstrap.servers", servers);
                        config.put("compression.type", field[2]);
                        config.put("enable.idempotence", "true");
                        config.put("acks", "all");
                        config.put("linger.ms", "50");
                        config.put("batch.size", "65536");
                        config.put("max.request.size", "8388608");
                        config.put("key.serializer", ByteArraySerializer.class.getName());
                        config.put("value.serializer", ByteArraySerializer.class.getName());
                        boolean transactional = !field[3].equals("-");
                        if (transactional) {
                            config.put("transactional.id", field[3]);
                        }
                        KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(config);
                        if (transactional) {
                            producer.initTransactions();
                        }
                        producers.put(field[1], producer);
                    }
                    case "SEND" -> sent.add(producers.get(field[1]).send(new ProducerRecord<>(
                            field[2],
                            Integer.parseInt(field[3]),
                            Long.parseLong(field[4]),
                            bytes(field[5]),
                            bytes(field[6]),
                            headers(field[7]))));
                    case "BEGIN" -> producers.get(field[1]).beginTransaction();
                    case "FLUSH" -> producers.get(field[1]).flush();
                    case "COMMIT" -> producers.get(field[1]).commitTransaction();
                    case "ABORT" -> producers.get(field[1]).abortTransaction();
                    default -> throw new IllegalArgumentException("unknown command: " + field[0]);
                }
            }
            for (Future<RecordMetadata> record : sent) {
                record.get();
            }
        } finally {
            for (KafkaProducer<byte[], byte[]> producer : producers.values()) {
                producer.close();
            }
        }
        System.out.println("sent " + sent.size() + " records");
    }
}
