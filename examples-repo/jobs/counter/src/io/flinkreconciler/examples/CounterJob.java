package io.flinkreconciler.examples;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.nio.file.StandardCopyOption;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionStage;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;

import org.apache.flink.api.common.eventtime.WatermarkStrategy;
import org.apache.flink.api.common.functions.OpenContext;
import org.apache.flink.api.common.state.ValueState;
import org.apache.flink.api.common.state.ValueStateDescriptor;
import org.apache.flink.api.common.typeinfo.Types;
import org.apache.flink.api.connector.sink2.Sink;
import org.apache.flink.api.connector.sink2.SinkWriter;
import org.apache.flink.api.connector.sink2.WriterInitContext;
import org.apache.flink.api.connector.source.util.ratelimit.RateLimiter;
import org.apache.flink.api.connector.source.util.ratelimit.RateLimiterStrategy;
import org.apache.flink.api.java.functions.KeySelector;
import org.apache.flink.api.java.tuple.Tuple2;
import org.apache.flink.connector.datagen.source.DataGeneratorSource;
import org.apache.flink.connector.datagen.source.GeneratorFunction;
import org.apache.flink.streaming.api.datastream.DataStreamSink;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;
import org.apache.flink.streaming.api.functions.KeyedProcessFunction;
import org.apache.flink.util.Collector;
import org.apache.flink.util.ParameterTool;

/**
 * A small stateful job whose keyed state is observable from outside.
 *
 * <p>Records {@code k0..k(N-1)} are generated at a fixed rate; a keyed ValueState counts them per key and
 * a sink writes the latest count of each key to {@code <output-dir>/<key>} (write to a temp file, then an
 * atomic rename). A restore from a savepoint continues every count; a start from empty state resets them.
 *
 * <p>Args: {@code --output-dir DIR} (absolute, or relative to the TaskManager's working directory),
 * {@code --keys N} (default 4), {@code --rate R} records per second over all keys (default 100),
 * {@code --fail-above N} throws once a key's count would pass N (a job that crashes on every start),
 * {@code --rate-scope taskmanager} makes {@code --rate} the rate of all source subtasks of a TaskManager
 * together, whatever the parallelism (default {@code job}: the generator's own limiter),
 * {@code --rate-file F} (with {@code --rate-scope taskmanager}) reads the rate from file F while the job runs,
 * checked every half second, {@code --rate} while F is absent or unreadable (a test changes the input rate
 * without changing the job's spec in Git),
 * {@code --work-us N} costs N microseconds per record in the counting operator (default 0: an overloaded
 * job for the autoscaler), spent busy-spinning on a core, or asleep with {@code --work-mode sleep} (the
 * operator is just as busy to Flink's metrics, without taking a core from a shared machine),
 * {@code --hot-key-share F} sends that share of the records (0..1) to key {@code k0} and spreads the rest over
 * the other keys (skewed keys: one subtask of the counting operator busier than the others),
 * {@code --sink-parallelism N} runs the sink at parallelism N of its own ({@code setParallelism}), whatever the
 * job's parallelism (a sink that must not be scaled, e.g. one writer).
 * Checkpointing is configured by the cluster, not here.
 */
public final class CounterJob {

    private CounterJob() {}

    public static void main(String[] args) throws Exception {
        ParameterTool params = ParameterTool.fromArgs(args);
        String outputDir = params.getRequired("output-dir");
        int keys = params.getInt("keys", 4);
        double rate = params.getDouble("rate", 100.0);
        long failAbove = params.getLong("fail-above", Long.MAX_VALUE);
        long workMicros = params.getLong("work-us", 0L);
        String workMode = params.get("work-mode", "spin");
        String rateScope = params.get("rate-scope", "job");
        String rateFile = params.get("rate-file", null);
        double hotKeyShare = params.getDouble("hot-key-share", 0.0);
        int sinkParallelism = params.getInt("sink-parallelism", 0);
        if (hotKeyShare < 0 || hotKeyShare > 1) {
            throw new IllegalArgumentException("--hot-key-share must be within 0..1, got " + hotKeyShare);
        }
        if (sinkParallelism < 0) {
            throw new IllegalArgumentException("--sink-parallelism must be >= 1, got " + sinkParallelism);
        }
        if (!rateScope.equals("job") && !rateScope.equals("taskmanager")) {
            throw new IllegalArgumentException("--rate-scope must be job or taskmanager, got " + rateScope);
        }
        if (rateFile != null && !rateScope.equals("taskmanager")) {
            throw new IllegalArgumentException("--rate-file needs --rate-scope taskmanager");
        }
        if (workMicros < 0) {
            throw new IllegalArgumentException("--work-us must be >= 0, got " + workMicros);
        }
        if (!workMode.equals("spin") && !workMode.equals("sleep")) {
            throw new IllegalArgumentException("--work-mode must be spin or sleep, got " + workMode);
        }
        if (keys < 1) {
            throw new IllegalArgumentException("--keys must be >= 1, got " + keys);
        }
        if (rate <= 0) {
            throw new IllegalArgumentException("--rate must be > 0, got " + rate);
        }

        StreamExecutionEnvironment env = StreamExecutionEnvironment.getExecutionEnvironment();

        RateLimiterStrategy limit = rateScope.equals("job")
                ? RateLimiterStrategy.perSecond(rate) : new SharedRate(rate, rateFile);
        DataGeneratorSource<String> source = new DataGeneratorSource<>(
                new KeyGenerator(keys, hotKeyShare), Long.MAX_VALUE, limit, Types.STRING);

        DataStreamSink<Tuple2<String, Long>> sink = env
                .fromSource(source, WatermarkStrategy.noWatermarks(), "generator")
                .uid("counter-source")
                .name("generator")
                .keyBy(new ByKey())
                .process(new CountPerKey(failAbove, workMicros * 1000L, workMode.equals("sleep")))
                .uid("counter-count")
                .name("count-per-key")
                .sinkTo(new LatestCountSink(outputDir))
                .uid("counter-sink")
                .name("latest-count-files");
        if (sinkParallelism > 0) {
            sink.setParallelism(sinkParallelism);
        }

        env.execute("counter");
    }

    /**
     * One rate for every source subtask of a TaskManager JVM together. The generator's own splits are fixed
     * when the job first starts (one per subtask then): after an in-place rescale from 1 to 2 one subtask
     * keeps the only split, and {@code perSecond} would give it half the rate. Waiting readers are idle
     * (not busy) to Flink's metrics, as with {@code perSecond}. With a rate file, the rate in it (records per
     * second, a decimal number) replaces {@code --rate} from the next record on, checked every half second.
     */
    static final class SharedRate implements RateLimiterStrategy {
        private static final long serialVersionUID = 1L;
        private static final long RECHECK_NANOS = 500_000_000L;
        private static final AtomicLong NEXT = new AtomicLong(Long.MIN_VALUE);
        private static final AtomicLong INTERVAL = new AtomicLong(0L);
        private static final AtomicLong CHECKED = new AtomicLong(Long.MIN_VALUE);
        private static final ScheduledExecutorService TIMER = Executors.newSingleThreadScheduledExecutor(r -> {
            Thread t = new Thread(r, "counter-shared-rate");
            t.setDaemon(true);
            return t;
        });
        private final double rate;
        private final String rateFile;

        SharedRate(double rate, String rateFile) {
            this.rate = rate;
            this.rateFile = rateFile;
        }

        /** Nanoseconds between records: from the rate file when it holds a positive number, else --rate. */
        private long interval(long now) {
            long checked = CHECKED.get();
            long current = INTERVAL.get();
            if (current > 0 && now - checked < RECHECK_NANOS) {
                return current;
            }
            double r = rate;
            if (rateFile != null) {
                try {
                    double fromFile = Double.parseDouble(
                            new String(Files.readAllBytes(Paths.get(rateFile)), StandardCharsets.UTF_8).trim());
                    if (fromFile > 0) {
                        r = fromFile;
                    }
                } catch (IOException | NumberFormatException e) {
                    // absent or half-written: keep --rate
                }
            }
            long next = (long) (1_000_000_000L / r);
            INTERVAL.set(next);
            CHECKED.set(now);
            return next;
        }

        @Override
        public RateLimiter createRateLimiter(int parallelism) {
            return new RateLimiter() {
                @Override
                public CompletionStage<Void> acquire(int events) {
                    long now = System.nanoTime();
                    long interval = interval(now);
                    long slot = NEXT.getAndAccumulate(now, (prev, t) -> Math.max(prev, t) + interval * events);
                    long wait = Math.max(slot, now) - now;
                    if (wait <= 0) {
                        return CompletableFuture.completedFuture(null);
                    }
                    CompletableFuture<Void> done = new CompletableFuture<>();
                    TIMER.schedule(() -> done.complete(null), wait, TimeUnit.NANOSECONDS);
                    return done;
                }
            };
        }
    }

    /**
     * Maps the sequence number to one of N keys, round robin; with a hot-key share h, h of every 1000 records go
     * to k0 and the others round robin over k1..k(N-1). The k0 records are spread over the 1000 (a permutation of
     * the slots, by a factor coprime to 1000), not sent as one run: a run of 300 hot records, then 700 others,
     * made the load of each subtask swing over a cycle of several seconds, and no measurement shorter than that
     * cycle saw the skew it was meant to show.
     */
    static final class KeyGenerator implements GeneratorFunction<Long, String> {
        private static final long serialVersionUID = 1L;
        private final int keys;
        private final long hotPerMille;

        KeyGenerator(int keys, double hotKeyShare) {
            this.keys = keys;
            this.hotPerMille = Math.round(hotKeyShare * 1000);
        }

        @Override
        public String map(Long index) {
            if (hotPerMille <= 0 || keys < 2) {
                return "k" + (index % keys);
            }
            long slot = (index % 1000) * 389 % 1000;
            if (slot < hotPerMille) {
                return "k0";
            }
            return "k" + (1 + (index % (keys - 1)));
        }
    }

    /** A named class, not a lambda, so the key type needs no erasure hints. */
    static final class ByKey implements KeySelector<String, String> {
        private static final long serialVersionUID = 1L;

        @Override
        public String getKey(String value) {
            return value;
        }
    }

    /** The state under test: one Long per key. */
    static final class CountPerKey extends KeyedProcessFunction<String, String, Tuple2<String, Long>> {
        private static final long serialVersionUID = 1L;
        private final long failAbove;
        private final long workNanos;
        private final boolean sleep;
        private transient ValueState<Long> count;

        CountPerKey(long failAbove, long workNanos, boolean sleep) {
            this.failAbove = failAbove;
            this.workNanos = workNanos;
            this.sleep = sleep;
        }

        /** The configured cost of one record: wall-clock time, so the capacity per subtask is fixed. */
        private void work() {
            if (workNanos <= 0) {
                return;
            }
            long end = System.nanoTime() + workNanos;
            if (sleep) {
                java.util.concurrent.locks.LockSupport.parkNanos(workNanos);
                return;
            }
            long sink = 0;
            while (System.nanoTime() < end) {
                sink += sink * 31 + 7;  // keep the core busy
            }
            if (sink == 42) {
                System.out.print("");
            }
        }

        @Override
        public void open(OpenContext ctx) {
            count = getRuntimeContext().getState(new ValueStateDescriptor<>("count", Types.LONG));
        }

        @Override
        public void processElement(String key, Context ctx, Collector<Tuple2<String, Long>> out)
                throws Exception {
            work();
            Long current = count.value();
            long next = (current == null ? 0L : current) + 1L;
            if (next > failAbove) {  // a job that crashes on every start once its state is past a point
                throw new IllegalStateException("count of key " + key + " passed --fail-above " + failAbove);
            }
            count.update(next);
            out.collect(Tuple2.of(key, next));
        }
    }

    /** Writes the latest count of each key to its own file, atomically. */
    static final class LatestCountSink implements Sink<Tuple2<String, Long>> {
        private static final long serialVersionUID = 1L;
        private final String outputDir;

        LatestCountSink(String outputDir) {
            this.outputDir = outputDir;
        }

        @Override
        public SinkWriter<Tuple2<String, Long>> createWriter(WriterInitContext context) throws IOException {
            Path dir = Paths.get(outputDir).toAbsolutePath();
            Files.createDirectories(dir);
            int subtask = context.getTaskInfo().getIndexOfThisSubtask();
            return new Writer(dir, subtask);
        }
    }

    static final class Writer implements SinkWriter<Tuple2<String, Long>> {
        private final Path dir;
        private final int subtask;

        Writer(Path dir, int subtask) {
            this.dir = dir;
            this.subtask = subtask;
        }

        @Override
        public void write(Tuple2<String, Long> element, Context context) throws IOException {
            Path target = dir.resolve(element.f0);
            Path tmp = dir.resolve("." + element.f0 + ".tmp-" + subtask);
            Files.write(tmp, (element.f1 + "\n").getBytes(StandardCharsets.UTF_8));
            Files.move(tmp, target, StandardCopyOption.ATOMIC_MOVE, StandardCopyOption.REPLACE_EXISTING);
        }

        @Override
        public void flush(boolean endOfInput) {}

        @Override
        public void close() {}
    }
}
