// expect: {"r":{"a":2,"b":4},"opt":"none","tuple":[1,"x"],"async":10}
type Partial2<T> = { [K in keyof T]?: T[K] };
type Fn<T> = T extends (...args: infer A) => infer R ? R : never;
type Tpl = `prefix-${string}`;
function mapValues<T extends Record<string, number>>(o: T, f: (v: number) => number): { [K in keyof T]: number } {
    const out = {} as { [K in keyof T]: number };
    for (const k of Object.keys(o) as Array<keyof T>) out[k] = f(o[k] as number);
    return out;
}
function opt(x?: string, ...rest: number[]): string { return x ?? "none"; }
const tuple: [number, string?] = [1, "x"];
const p: Partial2<{ a: number }> = {};
async function later(n: number): Promise<number> { return n * 2; }
const a = await later(5);
({ r: mapValues({ a: 1, b: 2 }, (v: number): number => v * 2), opt: opt(), tuple, async: a })
