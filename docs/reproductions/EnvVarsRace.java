// Spark 4.3's environment map of a Python data source found by the automatic pyspark_*
// lookup is `mutable.Map(...).asJava` (PythonUtils.createPythonFunction), shared by every
// query that uses the format and written without a lock by each query's
// PythonStreamingSourceRunner.init() (four puts: the keys below). This program does what
// two queries starting at the same moment do to a fresh map, many times, and serialises
// each map as Spark serialises a task that carries it. Only Scala's library is needed:
//
//   java -cp "$(python -c 'import pyspark,os;print(os.path.dirname(pyspark.__file__))')/jars/scala-library-2.13.*.jar" \
//       docs/reproductions/EnvVarsRace.java
import java.io.ByteArrayOutputStream;
import java.io.ObjectOutputStream;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.CyclicBarrier;

public class EnvVarsRace {
    static final String[] KEYS = {
        "SPARK_LOCAL_DIRS", "SPARK_AUTH_SOCKET_TIMEOUT", "SPARK_BUFFER_SIZE", "SPARK_PYTHON_RUNTIME"};

    public static void main(String[] args) throws Exception {
        int rounds = args.length > 0 ? Integer.parseInt(args[0]) : 200_000;
        Map<String, Integer> failures = new TreeMap<>();
        for (int round = 0; round < rounds; round++) {
            scala.collection.mutable.HashMap<String, String> scalaMap = new scala.collection.mutable.HashMap<>();
            Map<String, String> environment = scala.jdk.javaapi.CollectionConverters.asJava(scalaMap);
            environment.put("PYTHONPATH", "/somewhere");
            CyclicBarrier start = new CyclicBarrier(2);
            Runnable init = () -> {
                try { start.await(); } catch (Exception e) { throw new RuntimeException(e); }
                for (String key : KEYS) environment.put(key, "value");
            };
            Thread first = new Thread(init), second = new Thread(init);
            first.start(); second.start(); first.join(); second.join();
            try (ObjectOutputStream out = new ObjectOutputStream(new ByteArrayOutputStream())) {
                out.writeObject(environment);
            } catch (Exception e) {
                failures.merge(e.getClass().getSimpleName() + ": " + e.getMessage(), 1, Integer::sum);
            }
        }
        int failed = failures.values().stream().mapToInt(Integer::intValue).sum();
        System.out.println(failed + " of " + rounds + " maps failed to serialise");
        failures.forEach((message, count) -> System.out.println("  " + count + " x " + message));
    }
}
