// expect: {"port":8080,"host":"h","len":3,"n":4,"t":"ok"}
type Config = { port: number; host: string };
const cfg = { port: 8080, host: "h" } satisfies Config;
const s = "abc" as unknown as string;
let maybe: string | null = "ok";
const el = maybe!;
const nums = [1, 2, 3, 4] as const;
const last = <number>nums[nums.length - 1];
let later!: number;
later = last;
({ port: cfg.port, host: cfg.host, len: s.length, n: later, t: el! })
